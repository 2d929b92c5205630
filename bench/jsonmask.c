/*
 * bench/jsonmask — what JSON mode costs per token (engine/model/jsonmask.h,
 * sampler_sample_allowed).
 *
 *   build/bench/jsonmask [--testdata DIR] [--rounds N]
 *
 * Vocabularies: DIR/models/docs-lm-21M-F16.gguf (SentencePiece, 8192 tokens),
 * DIR/vocab/ggml-vocab-llama-spm.gguf (32000), DIR/vocab/ggml-vocab-gpt-2.gguf (byte-level
 * BPE, 50257), and a byte-level vocabulary of 151936 tokens the size of Qwen2's, made
 * from GPT-2's (its tokens, then pairs of them joined; written to
 * build/bench-models/vocab-152k.gguf): DIR is ../shared/testdata by default, and a
 * vocabulary whose file is absent is left out. For each, a JSON document is tokenized and
 * its tokens taken one by one; at each state (object keys, strings, numbers, structure)
 * it times:
 *   allow_ns      one question about the token drawn (jsonmask_allows of the document's
 *                 next token, the first asked at its state, timed alone: the clock's own
 *                 cost of some 20-30 ns included): what a constrained draw costs when
 *                 its first draw is allowed, beside the draw itself;
 *   mask_ms       the whole vocabulary asked (jsonmask_allows of every token): what a
 *                 constrained draw costs when no kept candidate is allowed; mask_first_ms
 *                 the first of the rounds (a grammar's cursor learns its states as it
 *                 is asked, so its first round is the dearest);
 *   fallback_ms   sampler_sample_allowed, greedy, when the argmax is not allowed (that
 *                 pass and the sampler's own over the vocabulary);
 *   plain_ms      sampler_sample, greedy, on the same logits (the reference);
 *   fast_us       sampler_sample_allowed with the default sampling when the first draw is
 *                 allowed (the usual case), beside sampled_us, sampler_sample's;
 *   take_us       jsonmask_take (the state's next-byte set rebuilt), after the questions
 *                 above;
 *   step_us       the question about the token drawn and its take, on a cursor asked
 *                 nothing else (a generation's usual step: a grammar's cursor then learns
 *                 only the states the reply passes through).
 * Four JSON objects per vocabulary, format "json_object" (any object: JSON mode),
 * "json_schema" (the document's schema below, which it is an instance of: structured
 * output) and "json_schema_patterned" (the same with patterns on three of its strings,
 * the longest among them: their plain tokens are fed byte by byte through the pattern's
 * automaton) and "json_gbnf" (llama.cpp's grammars/json.gbnf through the GBNF grammar
 * recogniser, engine/model/grammar.h, its root given room for SentencePiece's leading
 * space): medians and maxima over the states (the times of mask_ms, fallback_ms and
 * plain_ms the best of --rounds), build_ms the table, worst_state the number of document
 * tokens taken before the slowest mask; the other lines' mask_ratio, allow_ratio,
 * take_ratio and step_ratio are their mask_ms, allow_ns, take_us and step_us over the
 * json_object line's, measured in the same run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench/bench.h"
#include "engine/gguf/gguf.h"
#include "engine/model/grammar.h"
#include "engine/model/jsonmask.h"
#include "engine/model/jsonschema.h"
#include "engine/model/sampler.h"
#include "engine/tok/tokenizer.h"

#define BIG_VOCAB 151936

static const char document[] =
    "{\"name\": \"llmsd\", \"version\": \"0.1.0\", \"models\": [{\"file\": "
    "\"docs-lm-21M-F16.gguf\", \"roles\": [\"generate\", \"embed\"], \"n_ctx\": 2048, "
    "\"rope\": {\"base\": 10000.0, \"scale\": 1e-3}}], \"limits\": {\"max_tokens\": 512, "
    "\"stop\": [\"\\n\\n\", \"caf\xc3\xa9\"], \"speculate\": true, \"kv\": null, \"ratio\": "
    "-0.25}, \"notes\": \"A daemon that owns the model weights once for every app and keeps "
    "each app's contexts alive across calls, hours and restarts.\"}";

/* The schema of the document, written as a service's settings would be (keys in the
 * document's order, bounds, enums, an Optional). */
static const char document_schema[] =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":64},"
    "\"version\":{\"type\":\"string\"},\"models\":{\"type\":\"array\",\"minItems\":1,"
    "\"items\":{\"type\":\"object\",\"properties\":{\"file\":{\"type\":\"string\"},\"roles\":"
    "{\"type\":\"array\",\"items\":{\"enum\":[\"generate\",\"embed\",\"rerank\"]}},\"n_ctx\":"
    "{\"type\":\"integer\",\"minimum\":1,\"maximum\":1048576},\"rope\":{\"type\":\"object\","
    "\"properties\":{\"base\":{\"type\":\"number\"},\"scale\":{\"type\":\"number\"}}}},"
    "\"required\":[\"file\",\"roles\"]}},\"limits\":{\"type\":\"object\",\"properties\":"
    "{\"max_tokens\":{\"type\":\"integer\",\"minimum\":1},\"stop\":{\"type\":\"array\","
    "\"items\":{\"type\":\"string\"},\"maxItems\":4},\"speculate\":{\"type\":\"boolean\"},"
    "\"kv\":{\"anyOf\":[{\"type\":\"object\"},{\"type\":\"null\"}]},\"ratio\":{\"type\":"
    "\"number\"}},\"required\":[\"max_tokens\"]},\"notes\":{\"type\":\"string\",\"maxLength\":"
    "400}},\"required\":[\"name\",\"version\",\"models\",\"limits\"]}";

/* The schema again with patterns: a version's digits, a file's extension, and the
 * notes free of angle brackets (the document's longest string). */
static const char patterned_schema[] =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":64},"
    "\"version\":{\"type\":\"string\",\"pattern\":\"^\\\\d+\\\\.\\\\d+\\\\.\\\\d+$\"},"
    "\"models\":{\"type\":\"array\",\"minItems\":1,"
    "\"items\":{\"type\":\"object\",\"properties\":{\"file\":{\"type\":\"string\","
    "\"pattern\":\"\\\\.gguf$\"},\"roles\":"
    "{\"type\":\"array\",\"items\":{\"enum\":[\"generate\",\"embed\",\"rerank\"]}},\"n_ctx\":"
    "{\"type\":\"integer\",\"minimum\":1,\"maximum\":1048576},\"rope\":{\"type\":\"object\","
    "\"properties\":{\"base\":{\"type\":\"number\"},\"scale\":{\"type\":\"number\"}}}},"
    "\"required\":[\"file\",\"roles\"]}},\"limits\":{\"type\":\"object\",\"properties\":"
    "{\"max_tokens\":{\"type\":\"integer\",\"minimum\":1},\"stop\":{\"type\":\"array\","
    "\"items\":{\"type\":\"string\"},\"maxItems\":4},\"speculate\":{\"type\":\"boolean\"},"
    "\"kv\":{\"anyOf\":[{\"type\":\"object\"},{\"type\":\"null\"}]},\"ratio\":{\"type\":"
    "\"number\"}},\"required\":[\"max_tokens\"]},\"notes\":{\"type\":\"string\",\"maxLength\":"
    "400,\"pattern\":\"^[^<>]*$\"}},\"required\":[\"name\",\"version\",\"models\",\"limits\"]}";

/* llama.cpp's grammars/json.gbnf (MIT License, Copyright (c) 2023-2024 The ggml authors),
 * its root given room for the space SentencePiece puts before the first word. */
static const char json_gbnf[] =
    "root   ::= \" \"? object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::=\n"
    "  \"{\" ws (\n"
    "            string \":\" ws value\n"
    "    (\",\" ws string \":\" ws value)*\n"
    "  )? \"}\" ws\n"
    "array  ::=\n"
    "  \"[\" ws (\n"
    "            value\n"
    "    (\",\" ws value)*\n"
    "  )? \"]\" ws\n"
    "string ::=\n"
    "  \"\\\"\" (\n"
    "    [^\"\\\\\\x7F\\x00-\\x1F] |\n"
    "    \"\\\\\" ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4}) # escapes\n"
    "  )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? "
    "([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

/* A format's medians, for the ratios of the next. */
typedef struct format_result {
    double mask_ms, take_us, allow_ns, step_us;
} format_result;

/* The constraint a line measures: a JSON mode cursor or a grammar's, two of them at the
 * start of a reply (one for step_us, one for the rest). */
typedef struct constraint {
    const char *format;
    bool (*allows)(const void *ctx, int32_t token);
    int (*take)(void *ctx, int32_t token);
    void *ctx, *ctx_steps;
} constraint;

/* Writes GPT-2's vocabulary grown to BIG_VOCAB tokens (the added ones pairs of its own
 * tokens, as a larger byte-level BPE vocabulary's longer tokens are) into path. */
static int write_big_vocab(const char *gpt2, const char *path, char err[ERR_MAX])
{
    gguf_file *g = gguf_open(gpt2, err);
    if (!g)
        return -1;
    enum gguf_value_type et;
    uint64_t n = 0;
    int rc = -1;
    gguf_writer *w = gguf_writer_new();
    char **strs = calloc(BIG_VOCAB, sizeof *strs);
    int32_t *types = malloc(sizeof *types * BIG_VOCAB);
    if (!w || !strs || !types || !gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n) ||
        n >= BIG_VOCAB || !gguf_arr_i32(g, "tokenizer.ggml.token_type", types, n)) {
        err_set(err, "%s: no tokens and types, or out of memory", gpt2);
        goto out;
    }
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        gguf_str k = gguf_key(g, i);
        if (k.len >= 10 && memcmp(k.ptr, "tokenizer.", 10) == 0 && gguf_writer_copy_kv(w, g, i)) {
            err_set(err, "cannot copy %.*s", (int)k.len, k.ptr);
            goto out;
        }
    }
    uint64_t rng = 0x6269677663616275u;
    for (uint64_t i = 0; i < BIG_VOCAB; i++) {
        gguf_str a, b;
        if (i < n) {
            gguf_arr_str(g, "tokenizer.ggml.tokens", i, &a);
            b.len = 0;
        } else {
            /* normal tokens of the original vocabulary only (ids past 256: no bytes) */
            uint64_t x = 256 + (uint64_t)(bench_uniform(&rng) * (double)(n - 300));
            uint64_t y = 256 + (uint64_t)(bench_uniform(&rng) * (double)(n - 300));
            gguf_arr_str(g, "tokenizer.ggml.tokens", x, &a);
            gguf_arr_str(g, "tokenizer.ggml.tokens", y, &b);
            types[i] = 1;
        }
        if (!(strs[i] = malloc(a.len + b.len + 1))) {
            err_set(err, "out of memory");
            goto out;
        }
        memcpy(strs[i], a.ptr, a.len);
        memcpy(strs[i] + a.len, b.ptr, b.len);
        strs[i][a.len + b.len] = '\0';
    }
    if (gguf_writer_set_str_arr(w, "tokenizer.ggml.tokens", (const char *const *)strs,
                                BIG_VOCAB) ||
        gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, types, BIG_VOCAB)) {
        err_set(err, "out of memory");
        goto out;
    }
    rc = gguf_writer_write(w, path, err);
out:
    for (int i = 0; strs && i < BIG_VOCAB; i++)
        free(strs[i]);
    free(strs);
    free(types);
    gguf_writer_free(w);
    gguf_close(g);
    return rc;
}

static bool jsonmask_ctx_allows(const void *ctx, int32_t token)
{
    return jsonmask_allows(ctx, token);
}

static int jsonmask_ctx_take(void *ctx, int32_t token)
{
    return jsonmask_take(ctx, token);
}

static bool grammar_ctx_allows(const void *ctx, int32_t token)
{
    return grammar_allows(ctx, token);
}

static int grammar_ctx_take(void *ctx, int32_t token)
{
    return grammar_take(ctx, token);
}

/* One format's run over the document with constraint k (at the start of a reply),
 * printed as one line: base NULL for JSON mode (then *out is filled), else the ratios to
 * *base. */
static int run_format(const char *name, const tokenizer *tok, double build_ms,
                      const constraint *k, int rounds, const format_result *base,
                      format_result *out)
{
    char err[ERR_MAX];
    int32_t n_vocab = tok_n_vocab(tok);
    int32_t ids[1024];
    int n_ids = tok_encode(tok, document, strlen(document), false, false, ids, 1024);
    float *logits = malloc(sizeof *logits * (size_t)n_vocab);
    double *mask = malloc(sizeof *mask * (size_t)(n_ids > 0 ? n_ids : 1));
    double *fallback = malloc(sizeof *fallback * (size_t)(n_ids > 0 ? n_ids : 1));
    double *plain = malloc(sizeof *plain * (size_t)(n_ids > 0 ? n_ids : 1));
    double *fast = malloc(sizeof *fast * (size_t)(n_ids > 0 ? n_ids : 1));
    double *take = malloc(sizeof *take * (size_t)(n_ids > 0 ? n_ids : 1));
    double *sampled = malloc(sizeof *sampled * (size_t)(n_ids > 0 ? n_ids : 1));
    double *allow = malloc(sizeof *allow * (size_t)(n_ids > 0 ? n_ids : 1));
    double *first = malloc(sizeof *first * (size_t)(n_ids > 0 ? n_ids : 1));
    double *steps = malloc(sizeof *steps * (size_t)(n_ids > 0 ? n_ids : 1));
    sampler_params gp = sampler_params_default(), dp = sampler_params_default();
    gp.temperature = 0;
    gp.seed = dp.seed = 1;
    sampler *greedy = sampler_new(n_vocab, &gp, err), *def = sampler_new(n_vocab, &dp, err);
    int rc = -1;
    if (n_ids <= 0 || n_ids > 1024 || !logits || !mask || !fallback || !plain || !fast ||
        !take || !sampled || !allow || !first || !steps || !greedy || !def) {
        fprintf(stderr, "bench/jsonmask: %s: %d tokens, or out of memory\n", name, n_ids);
        goto out;
    }
    uint64_t rng = 0x6a736f6e6d61736bu;
    for (int32_t i = 0; i < n_vocab; i++)
        logits[i] = (float)bench_gauss(&rng);
    for (int i = 0; i < n_ids; i++) {
        double s = bench_now_s();
        if (!k->allows(k->ctx_steps, ids[i]) || k->take(k->ctx_steps, ids[i])) {
            fprintf(stderr, "bench/jsonmask: %s %s: token %d of the document refused\n", name,
                    k->format, i);
            goto out;
        }
        steps[i] = (bench_now_s() - s) * 1e6;
    }
    sampler_constraint con = {k->allows, k->ctx};
    long allowed_sum = 0;
    for (int i = 0; i < n_ids; i++) {
        double best = 1e30;
        long allowed = 0;
        /* the first question at this state: the document's own token */
        double s = bench_now_s();
        bool own = k->allows(k->ctx, ids[i]);
        allow[i] = (bench_now_s() - s) * 1e9;
        if (!own) {
            fprintf(stderr, "bench/jsonmask: %s %s: token %d of the document refused\n", name,
                    k->format, i);
            goto out;
        }
        for (int r = 0; r < rounds; r++) {
            s = bench_now_s();
            allowed = 0;
            for (int32_t id = 0; id < n_vocab; id++)
                allowed += k->allows(k->ctx, id);
            s = bench_now_s() - s;
            if (r == 0)
                first[i] = s * 1e3;
            best = s < best ? s : best;
        }
        mask[i] = best * 1e3;
        allowed_sum += allowed;
        /* greedy whose argmax is refused: a token the state does not take made the best */
        int32_t refused = 0;
        while (refused < n_vocab && k->allows(k->ctx, refused))
            refused++;
        float keep = refused < n_vocab ? logits[refused] : 0;
        if (refused < n_vocab)
            logits[refused] = 100.0f;
        int32_t t = -1;
        fallback[i] = plain[i] = 1e30;
        for (int r = 0; r < rounds; r++) {
            double s = bench_now_s();
            t = sampler_sample_allowed(greedy, logits, NULL, 0, &con);
            s = (bench_now_s() - s) * 1e3;
            fallback[i] = s < fallback[i] ? s : fallback[i];
            s = bench_now_s();
            sampler_sample(greedy, logits, NULL, 0);
            s = (bench_now_s() - s) * 1e3;
            plain[i] = s < plain[i] ? s : plain[i];
        }
        if (refused < n_vocab)
            logits[refused] = keep;
        if (t < 0) {
            fprintf(stderr, "bench/jsonmask: %s %s: no token allowed at %d\n", name,
                    k->format, i);
            goto out;
        }
        /* the document's own token made the most likely: the first draw is allowed */
        keep = logits[ids[i]];
        logits[ids[i]] = 100.0f;
        s = bench_now_s();
        sampler_sample_allowed(def, logits, NULL, 0, &con);
        fast[i] = (bench_now_s() - s) * 1e6;
        s = bench_now_s();
        sampler_sample(def, logits, NULL, 0);
        sampled[i] = (bench_now_s() - s) * 1e6;
        logits[ids[i]] = keep;
        s = bench_now_s();
        if (k->take(k->ctx, ids[i])) {
            fprintf(stderr, "bench/jsonmask: %s %s: token %d of the document refused\n", name,
                    k->format, i);
            goto out;
        }
        take[i] = (bench_now_s() - s) * 1e6;
    }
    double mask_max = 0, fallback_max = 0;
    int worst = 0;
    for (int i = 0; i < n_ids; i++) {
        if (mask[i] > mask_max)
            mask_max = mask[i], worst = i;
        fallback_max = fallback[i] > fallback_max ? fallback[i] : fallback_max;
    }
    double mask_med = bench_median(mask, n_ids), take_med = bench_median(take, n_ids);
    double allow_med = bench_median(allow, n_ids), step_med = bench_median(steps, n_ids);
    printf("{\"bench\":\"jsonmask\",\"vocab\":\"%s\",\"format\":\"%s\",\"n_vocab\":%d,"
           "\"states\":%d,\"build_ms\":%.1f,\"mean_allowed\":%.0f,\"allow_ns\":%.0f,"
           "\"mask_ms\":%.3f,\"mask_first_ms\":%.3f,\"mask_ms_max\":%.3f,\"fallback_ms\":%.3f,"
           "\"fallback_ms_max\":%.3f,\"plain_ms\":%.3f,\"fast_us\":%.2f,\"sampled_us\":%.2f,"
           "\"take_us\":%.2f,\"step_us\":%.2f,\"worst_state\":%d",
           name, k->format, (int)n_vocab, n_ids, build_ms, (double)allowed_sum / n_ids,
           allow_med, mask_med, bench_median(first, n_ids), mask_max,
           bench_median(fallback, n_ids), fallback_max, bench_median(plain, n_ids),
           bench_median(fast, n_ids), bench_median(sampled, n_ids), take_med, step_med, worst);
    if (base)
        printf(",\"mask_ratio\":%.2f,\"allow_ratio\":%.2f,\"take_ratio\":%.2f,"
               "\"step_ratio\":%.2f", mask_med / base->mask_ms, allow_med / base->allow_ns,
               take_med / base->take_us, step_med / base->step_us);
    else
        *out = (format_result){mask_med, take_med, allow_med, step_med};
    printf("}\n");
    fflush(stdout);
    rc = 0;
out:
    free(logits);
    free(mask);
    free(fallback);
    free(plain);
    free(fast);
    free(take);
    free(sampled);
    free(allow);
    free(first);
    free(steps);
    sampler_free(greedy);
    sampler_free(def);
    return rc;
}

/* The four formats on the vocabulary of the file at path (json: json_gbnf compiled). */
static int run_vocab(const char *name, const char *path, jsonschema *const schemas[2],
                     const grammar *json, int rounds)
{
    char err[ERR_MAX];
    gguf_file *g = gguf_open(path, err);
    tokenizer *tok = NULL;
    jsonmask_vocab *v = NULL;
    grammar_vocab *gv = NULL;
    grammar_cursor *gc = NULL, *gc_steps = NULL;
    if (!g || tok_load(g, &tok, err)) {
        fprintf(stderr, "bench/jsonmask: %s: %s\n", path, err);
        gguf_close(g);
        return -1;
    }
    double t0 = bench_now_s(), build_ms = 0, grammar_build_ms = 0;
    int rc = jsonmask_vocab_new(tok, &v, err);
    build_ms = (bench_now_s() - t0) * 1e3;
    t0 = bench_now_s();
    rc = rc ? rc : grammar_vocab_new(tok, &gv, err);
    grammar_build_ms = (bench_now_s() - t0) * 1e3;
    rc = rc ? rc : grammar_cursor_new(json, gv, &gc, err);
    rc = rc ? rc : grammar_cursor_new(json, gv, &gc_steps, err);
    if (rc) {
        fprintf(stderr, "bench/jsonmask: %s\n", err);
    } else {
        format_result base;
        jsonmask_cursor c, c_steps;
        constraint k = {"json_object", jsonmask_ctx_allows, jsonmask_ctx_take, &c, &c_steps};
        jsonmask_cursor_init(&c, v);
        jsonmask_cursor_init(&c_steps, v);
        rc = run_format(name, tok, build_ms, &k, rounds, NULL, &base);
        for (int i = 0; i < 2 && !rc; i++) {
            k.format = i ? "json_schema_patterned" : "json_schema";
            jsonmask_cursor_init_schema(&c, v, schemas[i]);
            jsonmask_cursor_init_schema(&c_steps, v, schemas[i]);
            rc = run_format(name, tok, build_ms, &k, rounds, &base, NULL);
        }
        k = (constraint){"json_gbnf", grammar_ctx_allows, grammar_ctx_take, gc, gc_steps};
        rc = rc ? rc : run_format(name, tok, grammar_build_ms, &k, rounds, &base, NULL);
    }
    grammar_cursor_free(gc);
    grammar_cursor_free(gc_steps);
    grammar_vocab_free(gv);
    jsonmask_vocab_free(v);
    tok_free(tok);
    gguf_close(g);
    return rc;
}

int main(int argc, char **argv)
{
    const char *testdata = "../shared/testdata";
    int rounds = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--testdata") && i + 1 < argc) {
            testdata = argv[++i];
        } else if (!strcmp(argv[i], "--rounds") && i + 1 < argc && atoi(argv[i + 1]) > 0) {
            rounds = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: bench/jsonmask [--testdata DIR] [--rounds N]\n");
            return 2;
        }
    }
    static const char *const vocabs[][2] = {
        {"docs-8k", "models/docs-lm-21M-F16.gguf"},
        {"llama-spm-32k", "vocab/ggml-vocab-llama-spm.gguf"},
        {"gpt-2-50k", "vocab/ggml-vocab-gpt-2.gguf"},
    };
    char path[1024], err[ERR_MAX];
    int failures = 0;
    struct stat st;
    jsonschema *schemas[2] = {NULL, NULL};
    grammar *json = NULL;
    if (jsonschema_compile(document_schema, strlen(document_schema), &schemas[0], err) ||
        jsonschema_compile(patterned_schema, strlen(patterned_schema), &schemas[1], err) ||
        grammar_compile(json_gbnf, strlen(json_gbnf), &json, err)) {
        fprintf(stderr, "bench/jsonmask: %s\n", err);
        jsonschema_free(schemas[0]);
        jsonschema_free(schemas[1]);
        return 1;
    }
    for (size_t i = 0; i < sizeof vocabs / sizeof *vocabs; i++) {
        snprintf(path, sizeof path, "%s/%s", testdata, vocabs[i][1]);
        if (stat(path, &st) != 0) {
            fprintf(stderr, "bench/jsonmask: %s is absent: left out\n", path);
            continue;
        }
        failures += run_vocab(vocabs[i][0], path, schemas, json, rounds) != 0;
    }
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-gpt-2.gguf", testdata);
    if (stat(path, &st) == 0) {
        const char *big = "build/bench-models/vocab-152k.gguf";
        mkdir("build", 0755);
        mkdir("build/bench-models", 0755);
        if (stat(big, &st) != 0 && write_big_vocab(path, big, err)) {
            fprintf(stderr, "bench/jsonmask: %s: %s\n", big, err);
            failures++;
        } else {
            failures += run_vocab("gpt-2-grown-152k", big, schemas, json, rounds) != 0;
        }
    }
    jsonschema_free(schemas[0]);
    jsonschema_free(schemas[1]);
    grammar_free(json);
    return failures ? 1 : 0;
}
