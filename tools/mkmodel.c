/*
 * mkmodel — writes a random-weight model GGUF on a real vocabulary.
 *
 *   mkmodel -o OUT.gguf --arch llama|qwen2|qwen3|bert --dim D --layers L --heads H
 *           --kv-heads KH --ffn F --ctx C
 *           --type f32|f16|bf16|q8_0|q4_0|q4_k|q5_k|q6_k|q4_k_m|q5_k_m
 *           --vocab VOCAB.gguf [--seed S] [--head-dim HD] [--tied] [--threads N]
 *           [--pooling mean|cls|rank]   (bert; rank adds the cross-encoder head)
 *   mkmodel --help | --version
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "engine/gguf.h"
#include "engine/modelgen.h"
#include "engine/quant.h"

static const struct {
    const char *name;
    uint32_t type;
    bool k_m_mix;
} TYPES[] = {
    {"f32", QTYPE_F32, false},   {"f16", QTYPE_F16, false},   {"bf16", QTYPE_BF16, false},
    {"q8_0", QTYPE_Q8_0, false}, {"q4_0", QTYPE_Q4_0, false}, {"q4_k", QTYPE_Q4_K, false},
    {"q5_k", QTYPE_Q5_K, false}, {"q6_k", QTYPE_Q6_K, false},
    /* llama.cpp's Q4_K_M and Q5_K_M: some tensors in Q6_K (modelgen.h) */
    {"q4_k_m", QTYPE_Q4_K, true}, {"q5_k_m", QTYPE_Q5_K, true},
};

static void usage(FILE *out)
{
    fprintf(out,
            "usage: mkmodel -o OUT.gguf --arch llama|qwen2|qwen3|bert --dim D --layers L --heads H\n"
            "               --kv-heads KH --ffn F --ctx C\n"
            "               --type f32|f16|bf16|q8_0|q4_0|q4_k|q5_k|q6_k|q4_k_m|q5_k_m\n"
            "               --vocab VOCAB.gguf [--seed S] [--head-dim HD] [--tied] [--threads N]\n"
            "               [--pooling mean|cls|rank]  (bert: pooling_type; rank writes the\n"
            "               cross-encoder head; default cls)\n"
            "       mkmodel --help | --version\n"
            "Writes a model of random weights (deterministic in the seed) on the vocabulary\n"
            "of VOCAB.gguf. Progress goes to stderr when it is a terminal.\n");
}

/* A mistake on the command line: what is wrong, and where help is. */
__attribute__((format(printf, 1, 2), noreturn)) static void bad_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("mkmodel: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\n(mkmodel --help shows the options)\n", stderr);
    exit(2);
}

static int int_arg(const char *opt, const char *s)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 0 || v > 1 << 24)
        bad_usage("%s: '%s' is not an integer from 0 to %d", opt, s, 1 << 24);
    return (int)v;
}

/* Tensors done of all, on one terminal line rewritten in place. */
static void show_progress(int done, int total, void *user)
{
    (void)user;
    fprintf(stderr, "\rmkmodel: tensor %d of %d%s", done, total, done == total ? "\n" : "");
}

int main(int argc, char **argv)
{
    modelgen_params p = {.arch = NULL, .n_head_kv = 0, .seed = 1};
    const char *out = NULL, *vocab = NULL, *type = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--tied")) {
            p.tie_output = true;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--version")) {
            printf("mkmodel %s\n", LLMS_VERSION);
            return 0;
        }
        if (i + 1 >= argc)
            bad_usage("%s needs a value", a);
        const char *v = argv[++i];
        if (!strcmp(a, "-o"))
            out = v;
        else if (!strcmp(a, "--arch"))
            p.arch = v;
        else if (!strcmp(a, "--dim"))
            p.dim = int_arg(a, v);
        else if (!strcmp(a, "--layers"))
            p.n_layer = int_arg(a, v);
        else if (!strcmp(a, "--heads"))
            p.n_head = int_arg(a, v);
        else if (!strcmp(a, "--kv-heads"))
            p.n_head_kv = int_arg(a, v);
        else if (!strcmp(a, "--ffn"))
            p.n_ff = int_arg(a, v);
        else if (!strcmp(a, "--ctx"))
            p.n_ctx = int_arg(a, v);
        else if (!strcmp(a, "--head-dim"))
            p.head_dim = int_arg(a, v);
        else if (!strcmp(a, "--threads"))
            p.n_threads = int_arg(a, v);
        else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            p.seed = strtoull(v, &end, 10);
            if (errno || end == v || *end || v[0] == '-')
                bad_usage("--seed: '%s' is not an unsigned integer", v);
        }
        else if (!strcmp(a, "--type"))
            type = v;
        else if (!strcmp(a, "--pooling")) {
            p.pooling_type = !strcmp(v, "mean") ? 1 : !strcmp(v, "cls") ? 2 : !strcmp(v, "rank") ? 4 : 0;
            if (!p.pooling_type)
                bad_usage("--pooling: '%s' is not mean, cls or rank", v);
        }
        else if (!strcmp(a, "--vocab"))
            vocab = v;
        else
            bad_usage("unknown option '%s'", a);
    }
    if (!out || !p.arch || !type || !vocab)
        bad_usage("-o, --arch, --type and --vocab are required");
    if (!p.n_head_kv)
        p.n_head_kv = p.n_head;
    if (!p.pooling_type)
        p.pooling_type = 2;
    bool found = false;
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
        if (!strcasecmp(type, TYPES[i].name)) {
            p.type = TYPES[i].type;
            p.k_m_mix = TYPES[i].k_m_mix;
            found = true;
        }
    if (!found)
        bad_usage("--type: unknown type '%s'", type);
    char err[ERR_MAX];
    gguf_file *v = gguf_open(vocab, err);
    if (!v) {
        fprintf(stderr, "mkmodel: %s: %s\n", vocab, err);
        return 1;
    }
    p.vocab = v;
    if (isatty(STDERR_FILENO))
        p.progress = show_progress;
    int rc = modelgen_write(&p, out, err);
    gguf_close(v);
    if (rc < 0) {
        fprintf(stderr, "mkmodel: %s\n", err);
        return 1;
    }
    return 0;
}
