/*
 * mkmodel — writes a random-weight model GGUF on a real vocabulary.
 *
 *   mkmodel -o OUT.gguf --arch llama|qwen2|qwen3|bert|nomic-bert --dim D --layers L --heads H
 *           --kv-heads KH --ffn F --ctx C
 *           --type f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q2_k|q3_k|q4_k|q5_k|q6_k
 *                  |iq4_nl|iq4_xs|q2_k_mix|q3_k_s|q3_k_m|q3_k_l|q4_k_m|q5_k_m
 *                  |iq4_nl_mix|iq4_xs_mix
 *           --vocab VOCAB.gguf [--seed S] [--head-dim HD] [--tied] [--threads N]
 *           [--pooling mean|cls|last|rank]   (pooling_type; encoders default to cls
 *                                        or mean, rank, bert only, adds the cross-encoder
 *                                        head; a decoder gets one only when given)
 *   mkmodel -o OUT.gguf --from IN.gguf --type TYPE (any of the above)
 *   mkmodel --help | --version
 *
 * --from converts a model file's weights to another type, as llama.cpp's llama-quantize
 * does: every matrix whose rows are whole blocks of the type is dequantized and quantized
 * again, the rest (norms, biases) is copied, metadata too. A mix (q3_k_m ...) gives each
 * matrix the type llama-quantize gives it (modelgen_mix_type), its fallbacks for rows
 * that are not whole super-blocks included. bench/kvquant uses an F32 copy
 * of a Q8_0 model to measure KV compression without the activation rounding that Q8_0
 * matrix products add (8-bit activations: any change of the inputs flips some roundings).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"

static const struct {
    const char *name;
    uint32_t type;
    modelgen_mix mix;
} TYPES[] = {
    {"f32", QTYPE_F32, MODELGEN_MIX_NONE},   {"f16", QTYPE_F16, MODELGEN_MIX_NONE},
    {"bf16", QTYPE_BF16, MODELGEN_MIX_NONE}, {"q8_0", QTYPE_Q8_0, MODELGEN_MIX_NONE},
    {"q4_0", QTYPE_Q4_0, MODELGEN_MIX_NONE}, {"q4_1", QTYPE_Q4_1, MODELGEN_MIX_NONE},
    {"q5_0", QTYPE_Q5_0, MODELGEN_MIX_NONE}, {"q5_1", QTYPE_Q5_1, MODELGEN_MIX_NONE},
    {"q2_k", QTYPE_Q2_K, MODELGEN_MIX_NONE}, {"q3_k", QTYPE_Q3_K, MODELGEN_MIX_NONE},
    {"q4_k", QTYPE_Q4_K, MODELGEN_MIX_NONE}, {"q5_k", QTYPE_Q5_K, MODELGEN_MIX_NONE},
    {"q6_k", QTYPE_Q6_K, MODELGEN_MIX_NONE},   {"iq4_nl", QTYPE_IQ4_NL, MODELGEN_MIX_NONE},
    {"iq4_xs", QTYPE_IQ4_XS, MODELGEN_MIX_NONE},
    /* llama.cpp's mixes: some tensors in other types (modelgen.h); q2_k_mix is what
     * llama-quantize calls Q2_K, q2_k every matrix in Q2_K (and so for IQ4_NL, IQ4_XS) */
    {"q2_k_mix", QTYPE_Q2_K, MODELGEN_MIX_Q2_K}, {"q3_k_s", QTYPE_Q3_K, MODELGEN_MIX_Q3_K_S},
    {"q3_k_m", QTYPE_Q3_K, MODELGEN_MIX_Q3_K_M},
    {"q3_k_l", QTYPE_Q3_K, MODELGEN_MIX_Q3_K_L}, {"q4_k_m", QTYPE_Q4_K, MODELGEN_MIX_Q4_K_M},
    {"q5_k_m", QTYPE_Q5_K, MODELGEN_MIX_Q5_K_M},
    {"iq4_nl_mix", QTYPE_IQ4_NL, MODELGEN_MIX_IQ4_NL},
    {"iq4_xs_mix", QTYPE_IQ4_XS, MODELGEN_MIX_IQ4_XS},
};

static void usage(FILE *out)
{
    fprintf(out,
            "usage: mkmodel -o OUT.gguf --arch llama|qwen2|qwen3|bert|nomic-bert --dim D --layers L\n"
            "               --heads H\n"
            "               --kv-heads KH --ffn F --ctx C\n"
            "               --type f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q2_k|q3_k|q4_k|q5_k|q6_k\n"
            "                      |iq4_nl|iq4_xs|q2_k_mix|q3_k_s|q3_k_m|q3_k_l|q4_k_m|q5_k_m\n"
            "                      |iq4_nl_mix|iq4_xs_mix\n"
            "               --vocab VOCAB.gguf [--seed S] [--head-dim HD] [--tied] [--threads N]\n"
            "               [--pooling mean|cls|last|rank]  (pooling_type; encoders: default\n"
            "               cls for bert, mean for nomic-bert; rank, bert only, writes the\n"
            "               cross-encoder head; decoders: written only when given, as an\n"
            "               embedding model's)\n"
            "       mkmodel -o OUT.gguf --from IN.gguf --type TYPE (any of the above)\n"
            "       mkmodel --help | --version\n"
            "Writes a model of random weights (deterministic in the seed) on the vocabulary\n"
            "of VOCAB.gguf, or (--from) IN.gguf's model with its matrices converted to the\n"
            "type (a mix, such as q3_k_m: to the types llama.cpp's llama-quantize gives\n"
            "each; q2_k_mix is its Q2_K, iq4_nl_mix its IQ4_NL...). Progress goes to\n"
            "stderr when it is a terminal.\n");
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

/* The value of the u32 key "{arch}.suffix" of g, or 0 where there is none. */
static uint32_t arch_u32(const gguf_file *g, const char *suffix)
{
    gguf_str arch;
    char key[160];
    uint32_t v = 0;
    if (gguf_get_str(g, "general.architecture", &arch) && arch.len < 100) {
        snprintf(key, sizeof key, "%.*s.%s", (int)arch.len, arch.ptr, suffix);
        gguf_get_u32(g, key, &v);
    }
    return v;
}

/* Writes in's model to out with every matrix whose rows are whole blocks of type
 * converted to it, or with a mix to the type the mix gives it. 0, or -1 with err set. */
static int convert_model(const char *in, const char *out, uint32_t type, modelgen_mix mix,
                         char err[ERR_MAX])
{
    gguf_file *g = gguf_open(in, err);
    if (!g)
        return -1;
    gguf_writer *w = gguf_writer_new();
    int64_t n_tensors = gguf_n_tensors(g);
    void **bufs = calloc((size_t)n_tensors + 1, sizeof *bufs);
    float *row = NULL;
    int rc = -1;
    if (!w || !bufs) {
        snprintf(err, ERR_MAX, "out of memory");
        goto out;
    }
    for (int64_t i = 0; i < gguf_n_kv(g); i++)
        if (gguf_writer_copy_kv(w, g, i) < 0) {
            snprintf(err, ERR_MAX, "copying metadata: out of memory");
            goto out;
        }
    int block = quant_traits_of(type)->block_size;
    int n_layer = (int)arch_u32(g, "block_count");
    uint32_t heads = arch_u32(g, "attention.head_count");
    uint32_t kv = arch_u32(g, "attention.head_count_kv");
    int n_gqa = heads && kv ? (int)(heads / kv) : 1;
    bool has_output = gguf_find_tensor(g, "output.weight") != NULL;
    for (int64_t i = 0; i < n_tensors; i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        char name[128]; /* GGUF names are at most 64 bytes by convention; messages cut longer */
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        int64_t n = t->ne[0], rows = 1;
        for (uint32_t d = 1; d < t->n_dims; d++)
            rows *= t->ne[d];
        const void *data = t->data;
        uint32_t to = t->type;
        if (t->n_dims >= 2 && (mix != MODELGEN_MIX_NONE || n % block == 0))
            to = modelgen_mix_type(mix, type, name, n, n_layer, n_gqa, has_output);
        if (to != t->type) {
            if (!quant_traits_of(t->type)->computable) {
                snprintf(err, ERR_MAX, "%s: type %u cannot be read", name, t->type);
                goto out;
            }
            if (!quant_traits_of(to)->computable) {
                snprintf(err, ERR_MAX, "%s: type %s cannot be written", name,
                         quant_traits_of(to)->name);
                goto out;
            }
            size_t in_rb = quant_row_bytes(t->type, n), out_rb = quant_row_bytes(to, n);
            float *grown = realloc(row, sizeof *row * (size_t)n);
            bufs[i] = malloc(out_rb * (size_t)rows);
            if (!grown || !bufs[i]) {
                row = grown ? grown : row;
                snprintf(err, ERR_MAX, "%s: out of memory", name);
                goto out;
            }
            row = grown;
            for (int64_t r = 0; r < rows; r++) {
                quant_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)r * in_rb, row, n);
                quant_quantize_row(to, row, (uint8_t *)bufs[i] + (size_t)r * out_rb, n);
            }
            data = bufs[i];
        }
        if (gguf_writer_add_tensor(w, name, to, t->n_dims, t->ne, data) < 0) {
            snprintf(err, ERR_MAX, "%s: out of memory", name);
            goto out;
        }
    }
    rc = gguf_writer_write(w, out, err);
out:
    for (int64_t i = 0; bufs && i < n_tensors; i++)
        free(bufs[i]);
    free(bufs), free(row);
    gguf_writer_free(w);
    gguf_close(g);
    return rc;
}

int main(int argc, char **argv)
{
    modelgen_params p = {.arch = NULL, .n_head_kv = 0, .seed = 1};
    const char *out = NULL, *vocab = NULL, *type = NULL, *from = NULL;
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
            p.pooling_type = !strcmp(v, "mean")   ? 1
                             : !strcmp(v, "cls")  ? 2
                             : !strcmp(v, "last") ? 3
                             : !strcmp(v, "rank") ? 4
                                                  : 0;
            if (!p.pooling_type)
                bad_usage("--pooling: '%s' is not mean, cls, last or rank", v);
        }
        else if (!strcmp(a, "--vocab"))
            vocab = v;
        else if (!strcmp(a, "--from"))
            from = v;
        else
            bad_usage("unknown option '%s'", a);
    }
    if (from && (!out || !type || p.arch || vocab))
        bad_usage("--from takes -o and --type, and no model shape");
    if (!from && (!out || !p.arch || !type || !vocab))
        bad_usage("-o, --arch, --type and --vocab are required");
    if (!p.n_head_kv)
        p.n_head_kv = p.n_head;
    bool encoder = p.arch && (!strcmp(p.arch, "bert") || !strcmp(p.arch, "nomic-bert"));
    if (!p.pooling_type && encoder)
        p.pooling_type = !strcmp(p.arch, "nomic-bert") ? 1 : 2;
    bool found = false;
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
        if (!strcasecmp(type, TYPES[i].name)) {
            p.type = TYPES[i].type;
            p.mix = TYPES[i].mix;
            found = true;
        }
    if (!found)
        bad_usage("--type: unknown type '%s'", type);
    char err[ERR_MAX];
    if (from) {
        if (convert_model(from, out, p.type, p.mix, err) < 0) {
            fprintf(stderr, "mkmodel: %s: %s\n", from, err);
            unlink(out);
            return 1;
        }
        return 0;
    }
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
