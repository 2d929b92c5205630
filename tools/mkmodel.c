/*
 * mkmodel — writes a random-weight model GGUF on a real vocabulary.
 *
 *   mkmodel -o OUT.gguf --arch llama|qwen2|qwen3 --dim D --layers L --heads H
 *           --kv-heads KH --ffn F --ctx C --type f32|f16|bf16|q8_0|q4_0|q4_k|q5_k|q6_k
 *           --vocab VOCAB.gguf [--seed S] [--head-dim HD] [--tied] [--threads N]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "engine/gguf.h"
#include "engine/modelgen.h"
#include "engine/quant.h"

static const struct {
    const char *name;
    uint32_t type;
} TYPES[] = {
    {"f32", QTYPE_F32},   {"f16", QTYPE_F16},   {"bf16", QTYPE_BF16}, {"q8_0", QTYPE_Q8_0},
    {"q4_0", QTYPE_Q4_0}, {"q4_k", QTYPE_Q4_K}, {"q5_k", QTYPE_Q5_K}, {"q6_k", QTYPE_Q6_K},
};

static void usage(void)
{
    fprintf(stderr,
            "usage: mkmodel -o OUT.gguf --arch llama|qwen2|qwen3 --dim D --layers L --heads H\n"
            "               --kv-heads KH --ffn F --ctx C --type f32|f16|bf16|q8_0|q4_0|q4_k|q5_k|q6_k\n"
            "               --vocab VOCAB.gguf [--seed S] [--head-dim HD] [--tied] [--threads N]\n");
    exit(2);
}

static int int_arg(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < 0 || v > 1 << 24) {
        fprintf(stderr, "mkmodel: bad number '%s'\n", s);
        exit(2);
    }
    return (int)v;
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
        if (i + 1 >= argc)
            usage();
        const char *v = argv[++i];
        if (!strcmp(a, "-o"))
            out = v;
        else if (!strcmp(a, "--arch"))
            p.arch = v;
        else if (!strcmp(a, "--dim"))
            p.dim = int_arg(v);
        else if (!strcmp(a, "--layers"))
            p.n_layer = int_arg(v);
        else if (!strcmp(a, "--heads"))
            p.n_head = int_arg(v);
        else if (!strcmp(a, "--kv-heads"))
            p.n_head_kv = int_arg(v);
        else if (!strcmp(a, "--ffn"))
            p.n_ff = int_arg(v);
        else if (!strcmp(a, "--ctx"))
            p.n_ctx = int_arg(v);
        else if (!strcmp(a, "--head-dim"))
            p.head_dim = int_arg(v);
        else if (!strcmp(a, "--threads"))
            p.n_threads = int_arg(v);
        else if (!strcmp(a, "--seed"))
            p.seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--type"))
            type = v;
        else if (!strcmp(a, "--vocab"))
            vocab = v;
        else
            usage();
    }
    if (!out || !p.arch || !type || !vocab)
        usage();
    if (!p.n_head_kv)
        p.n_head_kv = p.n_head;
    bool found = false;
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
        if (!strcasecmp(type, TYPES[i].name)) {
            p.type = TYPES[i].type;
            found = true;
        }
    if (!found) {
        fprintf(stderr, "mkmodel: unknown type '%s'\n", type);
        return 2;
    }
    char err[ERR_MAX];
    gguf_file *v = gguf_open(vocab, err);
    if (!v) {
        fprintf(stderr, "mkmodel: %s: %s\n", vocab, err);
        return 1;
    }
    p.vocab = v;
    int rc = modelgen_write(&p, out, err);
    gguf_close(v);
    if (rc < 0) {
        fprintf(stderr, "mkmodel: %s\n", err);
        return 1;
    }
    return 0;
}
