/*
 * bench/constrained — what a constrained reply costs in the daemon: decode time per
 * generated token of the same Complete in free text, JSON mode, structured output (a JSON
 * Schema) and a GBNF grammar (llama.cpp's grammars/json.gbnf), as JSON lines.
 *
 *   build/bench/constrained [--runs N] [--tokens N] [--threads N] [--llmsd PATH]
 *                           [--model PATH] [--grammar FILE]
 *
 * One llmsd of this build serves the trained documentation model (docs-lm-21M-F16 of
 * $LLMS_TESTDATA or ../shared/testdata, or --model). Each format's Complete asks for up
 * to --tokens (256) tokens of a JSON settings file, sampled with fixed seeds (one per
 * run), end-of-generation tokens banned (ignore_eos) so that free text runs to the limit;
 * a constrained reply ends where its format allows nothing more. Each format's reply is
 * followed by free text of the same length and seed, its baseline (a token's cost grows
 * with its position). Each line has the medians over --runs (5) of decode_ms per
 * generated token (the daemon's own decode time: the forwards, the sampler, the
 * constraint's questions and takes), of its baseline's, and of the tokens generated; the
 * ratio lines are the medians of each run's per-token time over its baseline's.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "client/llms.h"
#include "engine/readall.h"

#define PROMPT "The service is described in config.json:\n"
#define MAX_RUNS 32

/* A small service's settings, as the schema tests describe them. */
#define SETTINGS_SCHEMA                                                                    \
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":24},"   \
    "\"port\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":65535},\"debug\":{\"type\":"      \
    "\"boolean\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"web\",\"db\",\"cache\"]},"  \
    "\"maxItems\":3}},\"required\":[\"name\",\"port\",\"debug\"]}"

enum { TEXT, JSON_OBJECT, JSON_SCHEMA, GBNF, N_FORMATS };
static const char *const format_names[N_FORMATS] = {"text", "json_object", "json_schema",
                                                    "json_gbnf"};

/* The reply of one format with one seed: decode ms per generated token, and the tokens. */
static int complete_once(llms_conn *c, int format, const char *grammar, int tokens,
                         uint64_t seed, double *ms_per_token, double *generated)
{
    llms_params p = LLMS_PARAMS_INIT;
    p.max_tokens = tokens;
    p.has_seed = 1;
    p.seed = seed;
    p.ignore_eos = 1;
    p.format = format == TEXT          ? LLMS_FORMAT_TEXT
               : format == JSON_OBJECT ? LLMS_FORMAT_JSON_OBJECT
               : format == JSON_SCHEMA ? LLMS_FORMAT_JSON_SCHEMA
                                       : LLMS_FORMAT_GRAMMAR;
    p.json_schema = format == JSON_SCHEMA ? SETTINGS_SCHEMA : NULL;
    p.grammar = format == GBNF ? grammar : NULL;
    llms_result r = {0};
    if (llms_complete(c, PROMPT, NULL, 0, &p, NULL, NULL, &r) != LLMS_OK) {
        fprintf(stderr, "constrained: %s: %s\n", format_names[format], llms_last_error(c));
        return -1;
    }
    *generated = r.generated_tokens;
    *ms_per_token = r.generated_tokens ? r.decode_ms / r.generated_tokens : 0;
    llms_result_free(&r);
    return 0;
}

/* Every format's replies over runs, each beside free text of its length and seed. */
static int measure(llms_conn *c, const char *grammar, int runs, int tokens,
                   double per_token[N_FORMATS][MAX_RUNS], double text_per_token[N_FORMATS][MAX_RUNS],
                   double generated[N_FORMATS][MAX_RUNS])
{
    /* one round of every format first: the daemon builds each token table once */
    double warm_ms, warm_n;
    for (int f = 0; f < N_FORMATS; f++)
        if (complete_once(c, f, grammar, 16, 1, &warm_ms, &warm_n))
            return -1;
    for (int r = 0; r < runs; r++)
        for (int f = 0; f < N_FORMATS; f++) {
            uint64_t seed = (uint64_t)r + 1;
            double n;
            if (complete_once(c, f, grammar, tokens, seed, &per_token[f][r], &generated[f][r]) ||
                complete_once(c, TEXT, grammar, (int)generated[f][r], seed,
                              &text_per_token[f][r], &n))
                return -1;
        }
    return 0;
}

int main(int argc, char **argv)
{
    int runs = 5, tokens = 256, threads = 1;
    const char *llmsd = "build/llmsd", *model = NULL, *grammar_file = "tests/engine/data/json.gbnf";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--runs") && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--llmsd") && i + 1 < argc)
            llmsd = argv[++i];
        else if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--grammar") && i + 1 < argc)
            grammar_file = argv[++i];
        else {
            fprintf(stderr, "usage: constrained [--runs N] [--tokens N] [--threads N] "
                            "[--llmsd PATH] [--model PATH] [--grammar FILE]\n");
            return 2;
        }
    }
    if (runs < 1 || runs > MAX_RUNS || tokens < 1 || threads < 1) {
        fprintf(stderr, "constrained: --runs 1..%d, --tokens and --threads >= 1\n", MAX_RUNS);
        return 2;
    }
    static char found[1024];
    if (!model) {
        const char *root = getenv("LLMS_TESTDATA");
        snprintf(found, sizeof found, "%s/models/docs-lm-21M-F16.gguf",
                 root ? root : "../shared/testdata");
        model = found;
    }
    char err[ERR_MAX];
    size_t len;
    char *grammar = readall_file(grammar_file, &len, err);
    if (!grammar || access(model, R_OK) != 0) {
        fprintf(stderr, "constrained: %s\n", grammar ? "no model (--model)" : err);
        free(grammar);
        return 1;
    }
    char dir[] = "/tmp/llmsd-bench-constrained-XXXXXX", conf[1200], sock[1100];
    if (!mkdtemp(dir)) {
        free(grammar);
        return 1;
    }
    snprintf(conf, sizeof conf, "model = %s\nthreads = %d\nspeculate = off\n", model, threads);
    pid_t pid = bench_llmsd_start("constrained", llmsd, dir, conf, sock, sizeof sock);
    llms_conn *c = NULL;
    /* [f][r]: format f's reply of run r, and free text of its length and seed */
    static double per_token[N_FORMATS][MAX_RUNS], text_per_token[N_FORMATS][MAX_RUNS],
        generated[N_FORMATS][MAX_RUNS];
    int rc = pid < 0 || llms_connect(sock, &c, err) != LLMS_OK ||
                     llms_bind(c, "bench") != LLMS_OK ||
                     measure(c, grammar, runs, tokens, per_token, text_per_token, generated)
                 ? 1
                 : 0;
    llms_close(c);
    bench_llmsd_stop(pid);
    free(grammar);
    if (rc)
        return 1;
    for (int f = 0; f < N_FORMATS; f++) {
        double ratio[MAX_RUNS];
        for (int r = 0; r < runs; r++)
            ratio[r] = per_token[f][r] / text_per_token[f][r];
        printf("{\"bench\":\"constrained\",\"format\":\"%s\",\"runs\":%d,\"threads\":%d,"
               "\"max_tokens\":%d,\"generated_tokens\":%.0f,\"decode_ms_per_token\":%.4f,"
               "\"text_decode_ms_per_token\":%.4f,\"ratio_to_text\":%.3f}\n",
               format_names[f], runs, threads, tokens, bench_median(generated[f], runs),
               bench_median(per_token[f], runs), bench_median(text_per_token[f], runs),
               bench_median(ratio, runs));
    }
    return 0;
}
