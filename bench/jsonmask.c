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
 *   mask_ms       the whole vocabulary asked (jsonmask_allows of every token): what a
 *                 constrained draw costs when no kept candidate is allowed;
 *   fallback_ms   sampler_sample_allowed, greedy, when the argmax is not allowed (that
 *                 pass and the sampler's own over the vocabulary);
 *   plain_ms      sampler_sample, greedy, on the same logits (the reference);
 *   fast_us       sampler_sample_allowed with the default sampling when the first draw is
 *                 allowed (the usual case), beside sampled_us, sampler_sample's;
 *   take_us       jsonmask_take (the state's next-byte set rebuilt).
 * Three JSON objects per vocabulary, format "json_object" (any object: JSON mode),
 * "json_schema" (the document's schema below, which it is an instance of: structured
 * output) and "json_schema_patterned" (the same with patterns on three of its strings,
 * the longest among them: their plain tokens are fed byte by byte through the pattern's
 * automaton): medians and maxima over the states (the times of mask_ms, fallback_ms and
 * plain_ms the best of --rounds), build_ms the table, worst_state the number of document
 * tokens taken before the slowest mask; a schema line's mask_ratio and take_ratio are its
 * mask_ms and take_us over the json_object line's, measured in the same run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench/bench.h"
#include "engine/gguf/gguf.h"
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

/* A format's medians, for the ratios of the next. */
typedef struct format_result {
    double mask_ms, take_us;
} format_result;

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

static bool cursor_allows(const void *ctx, int32_t token)
{
    return jsonmask_allows(ctx, token);
}

/* One format's run over the document on vocabulary v, printed as one line: schema NULL
 * for JSON mode (then *base is filled), else the ratios to *base. */
static int run_format(const char *name, const tokenizer *tok, const jsonmask_vocab *v,
                      double build_ms, const char *format, const jsonschema *schema,
                      int rounds, format_result *base)
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
    sampler_params gp = sampler_params_default(), dp = sampler_params_default();
    gp.temperature = 0;
    gp.seed = dp.seed = 1;
    sampler *greedy = sampler_new(n_vocab, &gp, err), *def = sampler_new(n_vocab, &dp, err);
    int rc = -1;
    if (n_ids <= 0 || n_ids > 1024 || !logits || !mask || !fallback || !plain || !fast ||
        !take || !sampled || !greedy || !def) {
        fprintf(stderr, "bench/jsonmask: %s: %d tokens, or out of memory\n", name, n_ids);
        goto out;
    }
    uint64_t rng = 0x6a736f6e6d61736bu;
    for (int32_t i = 0; i < n_vocab; i++)
        logits[i] = (float)bench_gauss(&rng);
    jsonmask_cursor c;
    jsonmask_cursor_init_schema(&c, v, schema ? schema : jsonschema_any_object());
    sampler_constraint con = {cursor_allows, &c};
    long allowed_sum = 0;
    for (int k = 0; k < n_ids; k++) {
        double best = 1e30;
        long allowed = 0;
        for (int r = 0; r < rounds; r++) {
            double s = bench_now_s();
            allowed = 0;
            for (int32_t id = 0; id < n_vocab; id++)
                allowed += jsonmask_allows(&c, id);
            s = bench_now_s() - s;
            best = s < best ? s : best;
        }
        mask[k] = best * 1e3;
        allowed_sum += allowed;
        /* greedy whose argmax is refused: a token the state does not take made the best */
        int32_t refused = 0;
        while (refused < n_vocab && jsonmask_allows(&c, refused))
            refused++;
        float keep = refused < n_vocab ? logits[refused] : 0;
        if (refused < n_vocab)
            logits[refused] = 100.0f;
        int32_t t = -1;
        fallback[k] = plain[k] = 1e30;
        for (int r = 0; r < rounds; r++) {
            double s = bench_now_s();
            t = sampler_sample_allowed(greedy, logits, NULL, 0, &con);
            s = (bench_now_s() - s) * 1e3;
            fallback[k] = s < fallback[k] ? s : fallback[k];
            s = bench_now_s();
            sampler_sample(greedy, logits, NULL, 0);
            s = (bench_now_s() - s) * 1e3;
            plain[k] = s < plain[k] ? s : plain[k];
        }
        if (refused < n_vocab)
            logits[refused] = keep;
        if (t < 0) {
            fprintf(stderr, "bench/jsonmask: %s: no token allowed at %d\n", name, k);
            goto out;
        }
        /* the document's own token made the most likely: the first draw is allowed */
        keep = logits[ids[k]];
        logits[ids[k]] = 100.0f;
        double s = bench_now_s();
        sampler_sample_allowed(def, logits, NULL, 0, &con);
        fast[k] = (bench_now_s() - s) * 1e6;
        s = bench_now_s();
        sampler_sample(def, logits, NULL, 0);
        sampled[k] = (bench_now_s() - s) * 1e6;
        logits[ids[k]] = keep;
        s = bench_now_s();
        if (jsonmask_take(&c, ids[k])) {
            fprintf(stderr, "bench/jsonmask: %s: token %d of the document refused\n", name, k);
            goto out;
        }
        take[k] = (bench_now_s() - s) * 1e6;
    }
    double mask_max = 0, fallback_max = 0;
    int worst = 0;
    for (int k = 0; k < n_ids; k++) {
        if (mask[k] > mask_max)
            mask_max = mask[k], worst = k;
        fallback_max = fallback[k] > fallback_max ? fallback[k] : fallback_max;
    }
    double mask_med = bench_median(mask, n_ids), take_med = bench_median(take, n_ids);
    printf("{\"bench\":\"jsonmask\",\"vocab\":\"%s\",\"format\":\"%s\",\"n_vocab\":%d,"
           "\"states\":%d,\"build_ms\":%.1f,\"mean_allowed\":%.0f,\"mask_ms\":%.3f,"
           "\"mask_ms_max\":%.3f,\"fallback_ms\":%.3f,\"fallback_ms_max\":%.3f,"
           "\"plain_ms\":%.3f,\"fast_us\":%.2f,\"sampled_us\":%.2f,\"take_us\":%.2f,"
           "\"worst_state\":%d",
           name, format, (int)n_vocab, n_ids, build_ms,
           (double)allowed_sum / n_ids, mask_med, mask_max, bench_median(fallback, n_ids),
           fallback_max, bench_median(plain, n_ids), bench_median(fast, n_ids),
           bench_median(sampled, n_ids), take_med, worst);
    if (schema)
        printf(",\"mask_ratio\":%.2f,\"take_ratio\":%.2f", mask_med / base->mask_ms,
               take_med / base->take_us);
    else
        *base = (format_result){mask_med, take_med};
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
    sampler_free(greedy);
    sampler_free(def);
    return rc;
}

/* The three formats on the vocabulary of the file at path. */
static int run_vocab(const char *name, const char *path, jsonschema *const schemas[2],
                     int rounds)
{
    char err[ERR_MAX];
    gguf_file *g = gguf_open(path, err);
    tokenizer *tok = NULL;
    jsonmask_vocab *v = NULL;
    if (!g || tok_load(g, &tok, err)) {
        fprintf(stderr, "bench/jsonmask: %s: %s\n", path, err);
        gguf_close(g);
        return -1;
    }
    double t0 = bench_now_s();
    int rc = -1;
    if (jsonmask_vocab_new(tok, &v, err)) {
        fprintf(stderr, "bench/jsonmask: %s\n", err);
    } else {
        double build_ms = (bench_now_s() - t0) * 1e3;
        format_result base;
        rc = run_format(name, tok, v, build_ms, "json_object", NULL, rounds, &base) ||
                     run_format(name, tok, v, build_ms, "json_schema", schemas[0], rounds,
                                &base) ||
                     run_format(name, tok, v, build_ms, "json_schema_patterned", schemas[1],
                                rounds, &base)
                 ? -1
                 : 0;
    }
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
    if (jsonschema_compile(document_schema, strlen(document_schema), &schemas[0], err) ||
        jsonschema_compile(patterned_schema, strlen(patterned_schema), &schemas[1], err)) {
        fprintf(stderr, "bench/jsonmask: %s\n", err);
        jsonschema_free(schemas[0]);
        return 1;
    }
    for (size_t i = 0; i < sizeof vocabs / sizeof *vocabs; i++) {
        snprintf(path, sizeof path, "%s/%s", testdata, vocabs[i][1]);
        if (stat(path, &st) != 0) {
            fprintf(stderr, "bench/jsonmask: %s is absent: left out\n", path);
            continue;
        }
        failures += run_vocab(vocabs[i][0], path, schemas, rounds) != 0;
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
            failures += run_vocab("gpt-2-grown-152k", big, schemas, rounds) != 0;
        }
    }
    jsonschema_free(schemas[0]);
    jsonschema_free(schemas[1]);
    return failures ? 1 : 0;
}
