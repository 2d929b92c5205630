/*
 * mkmodel — writes a random-weight model GGUF on a real vocabulary.
 *
 *   mkmodel -o OUT.gguf
 *           --arch llama|qwen2|qwen3|phi3|granite|qwen2moe|qwen3moe|olmoe|gemma|gemma2|gemma3
 *                  |olmo2|granitemoe|smollm3|exaone|stablelm|mistral3|exaone4|glm4|chatglm
 *                  |command-r|cohere2|starcoder2|phi2|seed_oss|hunyuan-dense|gpt-oss|deepseek2
 *                  |ernie4_5-moe|glm4moe|bert|nomic-bert|gemma-embedding
 *           --dim D --layers L --heads H --kv-heads KH --ffn F --ctx C
 *           [--experts N --experts-used K [--expert-ffn F] [--shared-ffn F]
 *            [--expert-type mxfp4|type]]
 *           --type f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q2_k|q3_k|q4_k|q5_k|q6_k
 *                  |iq4_nl|iq4_xs|mxfp4|iq3_s|iq3_xxs|iq2_s|iq2_xs|iq2_xxs|iq1_m|iq1_s
 *                  |q2_k_mix|q3_k_s|q3_k_m|q3_k_l|q4_k_m|q5_k_m|iq4_nl_mix|iq4_xs_mix
 *           --vocab VOCAB.gguf [--seed S] [--head-dim HD] [--tied] [--threads N]
 *           [--pooling mean|cls|last|rank]   (pooling_type; encoders default to cls
 *                                        or mean, rank, bert only, adds the cross-encoder
 *                                        head; a decoder gets one only when given)
 *           [--rope-dims N]   (decoders: partial rotary, rope.dimension_count N; stablelm's
 *                             default is a quarter of the head, glm4's and chatglm's half)
 *           [--rope-orig-ctx N]   (phi3: LongRoPE factors for an original context N < C;
 *                                  mistral3: YaRN's original context)
 *           [--sliding-window W]   (attention.sliding_window: phi3's, default none;
 *                                   gemma2/gemma3's/gpt-oss's/cohere2's, default 4096 /
 *                                   1024 / 128 / 4096; exaone4's, default none, with W
 *                                   the 32B's 3:1 layers)
 *           [--attn-softcap C] [--final-softcap C]   (gemma2; default 50 and 30)
 *           [--rope-linear F]      (rope.scaling.type linear with factor F: gemma3 4B+
 *                                   have 8, applied to the global layers)
 *           [--dense N]   (gemma-embedding: dense_2 and dense_3 through N features, as
 *                          EmbeddingGemma's 3072; default none)
 *           deepseek2 (DeepSeek-V2/V3's latent attention; --experts, --experts-used,
 *           --expert-ffn and --shared-experts required, --ffn the dense layers'):
 *           --kv-lora R --qk-nope N --qk-rope N --v-head N [--q-lora R]  (q_lora_rank;
 *                                   default none: V2-Lite's attn_q)
 *           [--shared-experts N] [--dense-lead N] [--gating softmax|sigmoid]
 *           [--norm-weights] [--weights-scale F] [--expert-groups G --groups-used U]
 *           [--exp-probs-b]   (V3's selection bias)
 *           [--yarn-factor F [--mscale-all-dim M] [--rope-orig-ctx N]]   (V2's YaRN;
 *                                   original context default C / F)
 *   mkmodel -o OUT.gguf --from IN.gguf --type TYPE (any of the above)
 *           [--lora ADAPTER.gguf]... [--lora-scaled ADAPTER.gguf SCALE]... [--threads N]
 *   mkmodel -o OUT.gguf --lora-of BASE.gguf --rank R [--alpha A] [--type f32|f16|bf16|q8_0]
 *           [--targets q,k,v,o,gate,up,down,output,token_embd] [--seed S] [--threads N]
 *   mkmodel --help | --version
 *
 * --experts makes a mixture of experts in llama.cpp's layout (qwen2moe, qwen3moe, olmoe,
 * granitemoe and gpt-oss need it; llama with it is Mixtral; llama's, olmoe's and
 * granitemoe's experts are of --ffn): --expert-ffn is an expert's hidden size (qwen2moe,
 * qwen3moe, gpt-oss; default --ffn), --shared-ffn qwen2moe's shared expert's (default
 * --ffn), or granitemoe's (Granite MoE Shared; none without it). gpt-oss writes its
 * experts in MXFP4 as its published files have them (--expert-type mxfp4, its default;
 * --expert-type type writes them in --type, as the other architectures do).
 *
 * --from converts a model file's weights to another type, as llama.cpp's llama-quantize
 * does: every matrix whose rows are whole blocks of the type is dequantized and quantized
 * again, the rest (norms, biases) is copied, metadata too. A mix (q3_k_m ...) gives each
 * matrix the type llama-quantize gives it (modelgen_mix_type), its fallbacks for rows
 * that are not whole super-blocks included. bench/kvquant uses an F32 copy
 * of a Q8_0 model to measure KV compression without the activation rounding that Q8_0
 * matrix products add (8-bit activations: any change of the inputs flips some roundings).
 * With --lora / --lora-scaled it merges LoRA adapters into the matrices first, as
 * llama.cpp's llama-export-lora does (W + s B A, in double), so that an adapter served
 * unmerged can be checked against a plain model.
 *
 * --lora-of writes a random LoRA adapter of BASE in llama.cpp's format (modelgen.h); the
 * targets default to every matrix of the layers (PEFT's all-linear), type f16, alpha the
 * rank (scale 1).
 */
#include <errno.h>
#include <math.h>
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
    {"iq4_xs", QTYPE_IQ4_XS, MODELGEN_MIX_NONE}, {"mxfp4", QTYPE_MXFP4, MODELGEN_MIX_NONE},
    {"iq3_s", QTYPE_IQ3_S, MODELGEN_MIX_NONE},   {"iq3_xxs", QTYPE_IQ3_XXS, MODELGEN_MIX_NONE},
    {"iq2_s", QTYPE_IQ2_S, MODELGEN_MIX_NONE},   {"iq2_xs", QTYPE_IQ2_XS, MODELGEN_MIX_NONE},
    {"iq2_xxs", QTYPE_IQ2_XXS, MODELGEN_MIX_NONE}, {"iq1_m", QTYPE_IQ1_M, MODELGEN_MIX_NONE},
    {"iq1_s", QTYPE_IQ1_S, MODELGEN_MIX_NONE},
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
            "usage: mkmodel -o OUT.gguf\n"
            "               --arch llama|qwen2|qwen3|phi3|granite|qwen2moe|qwen3moe|olmoe|\n"
            "                      gemma|gemma2|gemma3|olmo2|granitemoe|smollm3|exaone|\n"
            "                      stablelm|mistral3|exaone4|glm4|chatglm|command-r|cohere2|\n"
            "                      starcoder2|phi2|seed_oss|hunyuan-dense|gpt-oss|deepseek2|\n"
            "                      ernie4_5-moe|glm4moe|bert|nomic-bert|gemma-embedding\n"
            "               --dim D --layers L --heads H --kv-heads KH --ffn F --ctx C\n"
            "               [--experts N --experts-used K [--expert-ffn F] [--shared-ffn F]\n"
            "                [--expert-type mxfp4|type]]\n"
            "               (experts: qwen2moe, qwen3moe, olmoe, granitemoe and gpt-oss need\n"
            "               them, llama with them is Mixtral; an expert's hidden size and\n"
            "               qwen2moe's shared expert's default to --ffn, llama's, olmoe's\n"
            "               and granitemoe's are --ffn; granitemoe has a shared expert\n"
            "               only with --shared-ffn; the experts' type: gpt-oss's default\n"
            "               mxfp4, the others' --type)\n"
            "               --type f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q2_k|q3_k|q4_k|q5_k|q6_k\n"
            "                      |iq4_nl|iq4_xs|mxfp4|iq3_s|iq3_xxs|iq2_s|iq2_xs|iq2_xxs|iq1_m\n"
            "                      |iq1_s|q2_k_mix|q3_k_s|q3_k_m|q3_k_l|q4_k_m|q5_k_m|iq4_nl_mix\n"
            "                      |iq4_xs_mix\n"
            "               --vocab VOCAB.gguf [--seed S] [--head-dim HD] [--tied] [--threads N]\n"
            "               [--pooling mean|cls|last|rank]  (pooling_type; encoders: default\n"
            "               cls for bert, mean for nomic-bert and gemma-embedding; rank,\n"
            "               bert only, writes the cross-encoder head; decoders: written\n"
            "               only when given, as an embedding model's)\n"
            "               [--rope-dims N]  (decoders: rotate N of each head's dimensions;\n"
            "               stablelm's default is a quarter of them, glm4's and\n"
            "               chatglm's half)\n"
            "               [--rope-orig-ctx N]  (phi3: LongRoPE's long and short factors,\n"
            "               original context N; the long ones apply above it; mistral3:\n"
            "               YaRN's original context, default C / 16; deepseek2: YaRN's,\n"
            "               default C / --yarn-factor)\n"
            "               [--sliding-window W]  (phi3: default none; gemma2/gemma3/gpt-oss/\n"
            "               cohere2: default 4096 / 1024 / 128 / 4096; exaone4: default\n"
            "               none, with W the 32B's hybrid attention, every fourth layer\n"
            "               global)\n"
            "               [--attn-softcap C] [--final-softcap C]  (gemma2; default 50, 30)\n"
            "               [--rope-linear F]  (linear rope scaling; gemma3: global layers)\n"
            "               [--dense N]  (gemma-embedding: dense_2 and dense_3 through N\n"
            "               features; default none; gemma-embedding's window defaults to 512)\n"
            "               deepseek2 (latent attention; --experts, --experts-used,\n"
            "               --expert-ffn and --shared-experts required, --ffn the dense\n"
            "               layers'): --kv-lora R --qk-nope N --qk-rope N --v-head N\n"
            "               [--q-lora R]  (default none: V2-Lite's attn_q)\n"
            "               [--shared-experts N] [--dense-lead N] [--gating softmax|sigmoid]\n"
            "               [--norm-weights] [--weights-scale F]\n"
            "               [--expert-groups G --groups-used U] [--exp-probs-b]\n"
            "               [--yarn-factor F [--mscale-all-dim M]]  (V2's YaRN)\n"
            "               ernie4_5-moe (experts required; --shared-ffn F a shared expert):\n"
            "               [--dense-lead N] [--exp-probs-b]\n"
            "               glm4moe (experts required): [--shared-experts N] [--dense-lead N]\n"
            "               [--gating softmax|sigmoid] [--norm-weights] [--weights-scale F]\n"
            "               [--nextn N]  (prediction layers after the model's)\n"
            "       mkmodel -o OUT.gguf --from IN.gguf --type TYPE (any of the above)\n"
            "               [--lora ADAPTER.gguf]... [--lora-scaled ADAPTER.gguf SCALE]...\n"
            "               [--threads N]\n"
            "       mkmodel -o OUT.gguf --lora-of BASE.gguf --rank R [--alpha A]\n"
            "               [--type f32|f16|bf16|q8_0] [--seed S] [--threads N]\n"
            "               [--targets q,k,v,o,gate,up,down,output,token_embd]\n"
            "       mkmodel --help | --version\n"
            "Writes a model of random weights (deterministic in the seed) on the vocabulary\n"
            "of VOCAB.gguf; (--from) IN.gguf's model with its matrices converted to the\n"
            "type (a mix, such as q3_k_m: to the types llama.cpp's llama-quantize gives\n"
            "each; q2_k_mix is its Q2_K, iq4_nl_mix its IQ4_NL...), LoRA adapters merged\n"
            "into them first (as llama-export-lora); or (--lora-of) a random LoRA adapter\n"
            "of BASE.gguf in llama.cpp's format (targets: the layers' matrices, type f16,\n"
            "alpha the rank unless given). Progress goes to\n"
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

/* The --targets list: names of enum modelgen_lora_target bits. */
static unsigned targets_arg(const char *v)
{
    static const struct {
        const char *name;
        unsigned bit;
    } names[] = {
        {"q", MODELGEN_LORA_Q},         {"k", MODELGEN_LORA_K},
        {"v", MODELGEN_LORA_V},         {"o", MODELGEN_LORA_O},
        {"gate", MODELGEN_LORA_GATE},   {"up", MODELGEN_LORA_UP},
        {"down", MODELGEN_LORA_DOWN},   {"output", MODELGEN_LORA_OUTPUT},
        {"token_embd", MODELGEN_LORA_TOKEN_EMBD},
    };
    unsigned bits = 0;
    for (const char *p = v; *p;) {
        size_t len = strcspn(p, ",");
        unsigned bit = 0;
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            if (strlen(names[i].name) == len && strncmp(p, names[i].name, len) == 0)
                bit = names[i].bit;
        if (!bit)
            bad_usage("--targets: '%.*s' is none of q, k, v, o, gate, up, down, output, token_embd",
                      (int)len, p);
        bits |= bit;
        p += len + (p[len] == ',');
    }
    if (!bits)
        bad_usage("--targets: empty");
    return bits;
}

static float float_arg(const char *opt, const char *s)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !isfinite(v))
        bad_usage("%s: '%s' is not a number", opt, s);
    return v;
}

/* Adapters merged by --from, as llama-export-lora takes them. */
#define MKMODEL_LORA_MAX 16

int main(int argc, char **argv)
{
    modelgen_params p = {.arch = NULL, .n_head_kv = 0, .seed = 1};
    const char *out = NULL, *vocab = NULL, *type = NULL, *from = NULL, *lora_of = NULL;
    const char *expert_type = NULL;
    const char *lora[MKMODEL_LORA_MAX];
    float lora_scale[MKMODEL_LORA_MAX];
    int n_lora = 0, rank = 0;
    float alpha = NAN;
    unsigned targets = MODELGEN_LORA_LAYERS;
    bool rank_given = false, targets_given = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--tied")) {
            p.tie_output = true;
            continue;
        }
        if (!strcmp(a, "--norm-weights")) {
            p.expert_weights_norm = true;
            continue;
        }
        if (!strcmp(a, "--exp-probs-b")) {
            p.exp_probs_b = true;
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
        if (!strcmp(a, "--lora") || !strcmp(a, "--lora-scaled")) {
            if (n_lora == MKMODEL_LORA_MAX)
                bad_usage("%s: at most %d adapters", a, MKMODEL_LORA_MAX);
            lora[n_lora] = v;
            lora_scale[n_lora] = 1.0f;
            if (!strcmp(a, "--lora-scaled")) {
                if (i + 1 >= argc)
                    bad_usage("--lora-scaled needs a file and a scale");
                lora_scale[n_lora] = float_arg(a, argv[++i]);
            }
            n_lora++;
        } else if (!strcmp(a, "--lora-of"))
            lora_of = v;
        else if (!strcmp(a, "--rank"))
            rank = int_arg(a, v), rank_given = true;
        else if (!strcmp(a, "--alpha"))
            alpha = float_arg(a, v);
        else if (!strcmp(a, "--targets"))
            targets = targets_arg(v), targets_given = true;
        else if (!strcmp(a, "-o"))
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
        else if (!strcmp(a, "--experts"))
            p.n_expert = int_arg(a, v);
        else if (!strcmp(a, "--experts-used"))
            p.n_expert_used = int_arg(a, v);
        else if (!strcmp(a, "--expert-ffn"))
            p.n_ff_exp = int_arg(a, v);
        else if (!strcmp(a, "--shared-ffn"))
            p.n_ff_shexp = int_arg(a, v);
        else if (!strcmp(a, "--expert-type")) {
            if (strcmp(v, "mxfp4") != 0 && strcmp(v, "type") != 0)
                bad_usage("--expert-type: '%s' is not mxfp4 or type", v);
            expert_type = v;
        }
        else if (!strcmp(a, "--head-dim"))
            p.head_dim = int_arg(a, v);
        else if (!strcmp(a, "--rope-dims"))
            p.rope_dims = int_arg(a, v);
        else if (!strcmp(a, "--rope-orig-ctx"))
            p.rope_orig_ctx = int_arg(a, v);
        else if (!strcmp(a, "--sliding-window"))
            p.sliding_window = int_arg(a, v);
        else if (!strcmp(a, "--dense"))
            p.n_dense = int_arg(a, v);
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
        else if (!strcmp(a, "--attn-softcap"))
            p.attn_softcap = float_arg(a, v);
        else if (!strcmp(a, "--final-softcap"))
            p.final_softcap = float_arg(a, v);
        else if (!strcmp(a, "--rope-linear"))
            p.rope_linear = float_arg(a, v);
        else if (!strcmp(a, "--from"))
            from = v;
        else if (!strcmp(a, "--q-lora"))
            p.q_lora_rank = int_arg(a, v);
        else if (!strcmp(a, "--kv-lora"))
            p.kv_lora_rank = int_arg(a, v);
        else if (!strcmp(a, "--qk-nope"))
            p.qk_nope_dim = int_arg(a, v);
        else if (!strcmp(a, "--qk-rope"))
            p.qk_rope_dim = int_arg(a, v);
        else if (!strcmp(a, "--v-head"))
            p.v_head_dim = int_arg(a, v);
        else if (!strcmp(a, "--shared-experts"))
            p.n_expert_shared = int_arg(a, v);
        else if (!strcmp(a, "--dense-lead"))
            p.n_dense_lead = int_arg(a, v);
        else if (!strcmp(a, "--nextn"))
            p.nextn_layers = int_arg(a, v);
        else if (!strcmp(a, "--gating")) {
            p.expert_gating = !strcmp(v, "softmax") ? 1 : !strcmp(v, "sigmoid") ? 2 : 0;
            if (!p.expert_gating)
                bad_usage("--gating: '%s' is not softmax or sigmoid", v);
        }
        else if (!strcmp(a, "--weights-scale"))
            p.expert_weights_scale = float_arg(a, v);
        else if (!strcmp(a, "--expert-groups"))
            p.n_expert_groups = int_arg(a, v);
        else if (!strcmp(a, "--groups-used"))
            p.n_expert_groups_used = int_arg(a, v);
        else if (!strcmp(a, "--yarn-factor"))
            p.yarn_factor = float_arg(a, v);
        else if (!strcmp(a, "--mscale-all-dim"))
            p.yarn_mscale_all_dim = float_arg(a, v);
        else
            bad_usage("unknown option '%s'", a);
    }
    if (lora_of && (!out || from || p.arch || vocab || n_lora))
        bad_usage("--lora-of takes -o, --rank and the adapter's options, and no model shape");
    if (lora_of && !rank_given)
        bad_usage("--lora-of needs --rank");
    if (!lora_of && (rank_given || !isnan(alpha) || targets_given))
        bad_usage("--rank, --alpha and --targets are --lora-of's");
    if (n_lora && !from)
        bad_usage("--lora and --lora-scaled merge adapters into --from's model");
    if (from && (!out || !type || p.arch || vocab))
        bad_usage("--from takes -o and --type, and no model shape");
    if (!from && !lora_of && (!out || !p.arch || !type || !vocab))
        bad_usage("-o, --arch, --type and --vocab are required");
    if (lora_of && !type)
        type = "f16";
    if (!p.n_head_kv)
        p.n_head_kv = p.n_head;
    if (expert_type && !p.n_expert)
        bad_usage("--expert-type is the experts' (--experts)");
    p.mxfp4_experts = expert_type ? !strcmp(expert_type, "mxfp4")
                                  : p.arch && !strcmp(p.arch, "gpt-oss");
    bool encoder = p.arch && (!strcmp(p.arch, "bert") || !strcmp(p.arch, "nomic-bert") ||
                              !strcmp(p.arch, "gemma-embedding"));
    if (!p.pooling_type && encoder)
        p.pooling_type = !strcmp(p.arch, "bert") ? 2 : 1;
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
    if (lora_of && p.mix != MODELGEN_MIX_NONE)
        bad_usage("--lora-of: '%s' is a mix; give one type", type);
    if (from) {
        if (modelgen_convert(from, out, p.type, p.mix, n_lora, lora, lora_scale, p.n_threads,
                             err) < 0) {
            fprintf(stderr, "mkmodel: %s: %s\n", from, err);
            unlink(out);
            return 1;
        }
        return 0;
    }
    if (lora_of) {
        gguf_file *base = gguf_open(lora_of, err);
        if (!base) {
            fprintf(stderr, "mkmodel: %s: %s\n", lora_of, err);
            return 1;
        }
        modelgen_lora_params lp = {.base = base, .rank = rank,
                                   .alpha = isnan(alpha) ? (float)rank : alpha, .type = p.type,
                                   .targets = targets, .seed = p.seed, .n_threads = p.n_threads};
        int rc = modelgen_write_lora(&lp, out, err);
        gguf_close(base);
        if (rc < 0) {
            fprintf(stderr, "mkmodel: %s: %s\n", lora_of, err);
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
