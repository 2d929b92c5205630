/*
 * llms-run — one prompt through the engine, like llama.cpp's llama-cli.
 *
 *   llms-run -m MODEL.gguf -p "text" [-n 64] [--temp 0] [-t threads]   generate
 *                                                    (--json: one JSON object;
 *                                                    --json-schema F: F's instance)
 *   llms-run -m VOCAB.gguf --tokenize  < text        token ids, no BOS/EOS added
 *   llms-run -m VOCAB.gguf --detokenize < ids        text of the ids
 *   llms-run -m MODEL.gguf --ids -p "1 450 4996"     prompt and output as token ids
 *   llms-run -m MODEL.gguf --perplexity FILE -c 512  perplexity as llama-perplexity does
 *   llms-run -m MODEL.gguf --embed [--pooling P] < text  the text's embedding, like
 *                                                    llama-embedding (bert or decoder)
 *
 * The continuation goes to stdout as it is produced; timings go to stderr.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/clock.h"
#include "engine/cuda/cuda.h"
#include "engine/encoder/bert.h"
#include "engine/tok/chat.h"
#include "engine/model/drybreak.h"
#include "engine/model/embed.h"
#include "engine/model/grammar.h"
#include "engine/model/jsonmask.h"
#include "engine/model/jsonschema.h"
#include "engine/gguf/gguf.h"
#include "engine/kv/kv.h"
#include "engine/model/lora.h"
#include "engine/model/model.h"
#include "engine/model/prefill.h"
#include "engine/model/sampler.h"
#include "engine/readall.h"
#include "engine/tok/stop.h"
#include "engine/tok/tokenizer.h"

enum run_mode { MODE_GENERATE, MODE_TOKENIZE, MODE_DETOKENIZE, MODE_PERPLEXITY, MODE_EMBED };

typedef struct run_options {
    enum run_mode mode;
    const char *model_path;
    const char *prompt;
    const char *prompt_file;
    const char *perplexity_file;
    const char *system_prompt;
    const char *chat_template; /* --chat-template: a family name; NULL: the file's */
    const char *pooling;      /* --embed: "cls", "mean", "last"; NULL: the model's */
    const char *stop[STOP_MAX];
    int n_stop;
    int n_predict;
    int n_threads;
    int n_ctx;
    int n_batch;
    int device;            /* --device: -1 the CPU, else the GPU's index */
    bool ids;
    bool chat;
    bool ignore_eos;
    bool json;             /* JSON mode: the continuation is one JSON object */
    const char *json_schema_file; /* --json-schema: ... an instance of this file's schema */
    const char *grammar;          /* --grammar: the continuation is a sentence of this GBNF */
    const char *grammar_file;     /* --grammar-file: ... of the GBNF in this file */
    bool plan;             /* print the prefill's memory plan and stop */
    int plan_tokens;       /* --prompt-tokens: plan for this length instead of a prompt */
    int prefill_budget_mb; /* 0: none */
    int resident_small_mb; /* -1: every weight stays mapped in (no streaming) */
    gguf_load load;
    sampler_params sampling;
    const char *dry_breakers[DRYBREAK_MAX]; /* --dry-sequence-breaker: DRY's own breakers */
    int n_dry_breakers;                     /* 0: llama.cpp's, unless dry_none */
    bool dry_none;                          /* --dry-sequence-breaker none: no breakers */
    const char *lora[MODEL_LORA_MAX];       /* --lora, --lora-scaled: adapter files */
    float lora_scale[MODEL_LORA_MAX];
    int n_lora;
} run_options;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: llms-run -m MODEL.gguf [options]\n"
            "  -p, --prompt TEXT        prompt (with --ids: space-separated token ids)\n"
            "  -f, --file FILE          read the prompt from FILE\n"
            "  -n, --n-predict N        tokens to generate (default 64)\n"
            "  -t, --threads N          threads (default: online cores)\n"
            "  -c, --ctx-size N         context size in tokens (default: model's, at most 4096)\n"
            "  -b, --batch-size N       prefill batch size (default 512)\n"
            "      --lora FILE          apply a LoRA adapter (llama.cpp's GGUF format) at scale 1,\n"
            "                           unmerged (repeatable: they stack)\n"
            "      --lora-scaled FILE S the same at scale S\n"
            "      --mmap               map the weights, shared with the page cache (default)\n"
            "      --no-mmap            read them into private memory on huge pages\n"
            "  -dev, --device D         cpu (default), cuda or cuda:N: run the forward on that\n"
            "                           GPU (a make CUDA=1 build; llama, qwen2, qwen3)\n"
            "      --temp T             temperature, 0 = greedy (default 0.8)\n"
            "      --top-k N            (default 40, 0 = off)\n"
            "      --top-p P            (default 0.95, 1 = off)\n"
            "      --min-p P            (default 0.05, 0 = off)\n"
            "      --repeat-penalty R   (default 1.0 = off)\n"
            "      --frequency-penalty F, --presence-penalty P\n"
            "                           OpenAI's, in [-2, 2] (default 0 = off)\n"
            "      --repeat-last-n N    (default 64)\n"
            "  -s, --seed N             sampling seed (default random)\n"
            "      --min-keep N         top-p, min-p, typical and XTC keep at least N (default 0)\n"
            "      --typical P          locally typical sampling (default 1.0 = off)\n"
            "      --top-nsigma N       keep logits within N standard deviations of the best\n"
            "                           (default -1 = off)\n"
            "      --xtc-probability P, --xtc-threshold T\n"
            "                           XTC: with probability P drop the tokens above T but the\n"
            "                           least likely of them (default 0 = off, 0.1)\n"
            "      --dynatemp-range R, --dynatemp-exp E\n"
            "                           dynamic temperature: temp +- R by the entropy^E\n"
            "                           (default 0 = off, 1)\n"
            "      --dry-multiplier M, --dry-base B, --dry-allowed-length N,\n"
            "      --dry-penalty-last-n N\n"
            "                           DRY: a token extending a repetition loses M * B ^\n"
            "                           (length - N) (default 0 = off, 1.75, 2, -1 = context)\n"
            "      --dry-sequence-breaker TEXT  a DRY breaker (repeatable; replaces\n"
            "                           llama.cpp's \\n : \" *; 'none': none)\n"
            "      --mirostat N         Mirostat 1 or 2 in place of the samplers (default 0)\n"
            "      --mirostat-lr E, --mirostat-ent T  its learning rate and target surprise\n"
            "                           (default 0.1, 5.0)\n"
            "      --samplers 'a;b;...' the samplers that run, in order, by llama.cpp's names\n"
            "                           (penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;\n"
            "                           xtc;temperature, the default)\n"
            "      --sampling-seq LETTERS  the same by letters (default edskypmxt)\n"
            "      --stop TEXT          stop when TEXT is generated (repeatable)\n"
            "      --ignore-eos         keep generating past end-of-generation tokens\n"
            "      --json               JSON mode: only tokens that keep the continuation a\n"
            "                           prefix of one JSON object; it ends as the object closes\n"
            "                           (OpenAI's response_format json_object)\n"
            "      --json-schema FILE   JSON mode, and an instance of the JSON Schema in FILE\n"
            "                           (OpenAI's json_schema; engine/model/jsonschema.h)\n"
            "      --grammar GBNF       only tokens that keep the continuation a prefix of a\n"
            "                           sentence of the grammar (llama.cpp's GBNF, rule root;\n"
            "                           engine/model/grammar.h); it ends where nothing may follow\n"
            "      --grammar-file FILE  the same with the grammar in FILE\n"
            "      --chat               wrap the prompt in the model's chat template\n"
            "      --system TEXT        system message for --chat\n"
            "      --chat-template NAME the template's family, not the file's (" CHAT_FAMILY_NAMES
            ")\n"
            "      --ids                prompt and output are token ids\n"
            "      --tokenize           print the token ids of stdin (no BOS/EOS)\n"
            "      --detokenize         print the text of the token ids on stdin\n"
            "      --perplexity FILE    perplexity of FILE in chunks of -c tokens (on a\n"
            "                           terminal, stderr shows the time left)\n"
            "      --embed              print the L2-normalised embedding of stdin (one\n"
            "                           trailing newline dropped), pooled as the file's\n"
            "                           {arch}.pooling_type says (bert without one: cls;\n"
            "                           a decoder without one: the last token)\n"
            "      --pooling P          cls, mean or last: overrides the file's\n"
            "      --prefill-budget-mb N  working memory of the prefill: steps that do not\n"
            "                           fit are partitioned (engine/model/prefill.h; default none)\n"
            "      --resident-small-mb N  weights stream per layer but the smallest fragments,\n"
            "                           up to N MiB (mapped weights; default: all resident)\n"
            "      --plan               print the prefill's memory plan for the prompt (or\n"
            "                           --prompt-tokens N) step by step, and compute nothing\n"
            "      --prompt-tokens N    the prompt length --plan plans for\n"
            "  -h, --help               this text\n"
            "      --version            the version\n");
}

static int parse_int(const char *flag, const char *s, int min, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > 1 << 30) {
        fprintf(stderr, "llms-run: %s: '%s' is not an integer >= %d\n", flag, s, min);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_float(const char *flag, const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !isfinite(v)) {
        fprintf(stderr, "llms-run: %s: '%s' is not a number\n", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* llama.cpp's names of its samplers (its tools take the second spellings too) and
 * letters, by step. */
static const struct {
    const char *name, *alt1, *alt2;
    char letter;
    enum sampler_step step;
} sampler_names[] = {
    {"penalties", NULL, NULL, 'e', SAMPLER_PENALTIES},
    {"dry", NULL, NULL, 'd', SAMPLER_DRY},
    {"top_n_sigma", "top-n-sigma", NULL, 's', SAMPLER_TOP_N_SIGMA},
    {"top_k", "top-k", NULL, 'k', SAMPLER_TOP_K},
    {"typ_p", "typical", "typical-p", 'y', SAMPLER_TYPICAL},
    {"top_p", "top-p", "nucleus", 'p', SAMPLER_TOP_P},
    {"min_p", "min-p", NULL, 'm', SAMPLER_MIN_P},
    {"xtc", NULL, NULL, 'x', SAMPLER_XTC},
    {"temperature", "temp", NULL, 't', SAMPLER_TEMPERATURE},
};

/* The step of a sampler's name (names) or letter: 0.., or -1. */
static int step_of(const char *name, size_t len, char letter)
{
    for (size_t i = 0; i < sizeof sampler_names / sizeof *sampler_names; i++) {
        const char *n[3] = {sampler_names[i].name, sampler_names[i].alt1, sampler_names[i].alt2};
        for (int k = 0; k < 3 && name; k++)
            if (n[k] && strlen(n[k]) == len && strncmp(n[k], name, len) == 0)
                return (int)sampler_names[i].step;
        if (!name && letter == sampler_names[i].letter)
            return (int)sampler_names[i].step;
    }
    return -1;
}

/* --samplers (names separated by ';') or --sampling-seq (letters) into p's order; the
 * sampler checks each comes once. 0, or -1 after saying why. */
static int parse_order(const char *flag, const char *v, bool letters, sampler_params *p)
{
    p->n_order = 0;
    for (const char *at = v; *at;) {
        size_t len = letters ? 1 : strcspn(at, ";");
        int step = letters ? step_of(NULL, 0, *at) : step_of(at, len, 0);
        if (step < 0 || p->n_order == SAMPLER_STEPS) {
            fprintf(stderr, "llms-run: %s: '%.*s' is %s\n", flag, (int)len, at,
                    step < 0 ? "no sampler of llama.cpp's" : "one sampler too many");
            return -1;
        }
        p->order[p->n_order++] = (enum sampler_step)step;
        at += len + (!letters && at[len] == ';');
    }
    return 0;
}

/* Whether arg is the flag's short form (NULL when it has none) or its long form. */
static bool is_flag(const char *arg, const char *short_form, const char *long_form)
{
    return (short_form && strcmp(arg, short_form) == 0) || strcmp(arg, long_form) == 0;
}

static int parse_args(int argc, char **argv, run_options *o)
{
    memset(o, 0, sizeof *o);
    o->n_predict = 64;
    o->n_batch = 512;
    o->device = -1;
    o->resident_small_mb = -1;
    o->load = GGUF_LOAD_MAP;
    o->sampling = sampler_params_default();

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
#define IS(short_flag, long_flag) is_flag(a, short_flag, long_flag)
#define NEED_VALUE()                                                        \
    do {                                                                    \
        if (!v) {                                                           \
            fprintf(stderr, "llms-run: %s needs a value\n", a);             \
            return -1;                                                      \
        }                                                                   \
        i++;                                                                \
    } while (0)
        if (IS("-h", "--help")) {
            usage(stdout);
            exit(0);
        } else if (IS(NULL, "--version")) {
            printf("llms-run %s\n", LLMS_VERSION);
            exit(0);
        } else if (IS("-m", "--model")) {
            NEED_VALUE();
            o->model_path = v;
        } else if (IS("-p", "--prompt")) {
            NEED_VALUE();
            o->prompt = v;
        } else if (IS("-f", "--file")) {
            NEED_VALUE();
            o->prompt_file = v;
        } else if (IS("-n", "--n-predict")) {
            NEED_VALUE();
            rc = parse_int(a, v, 0, &o->n_predict);
        } else if (IS("-t", "--threads")) {
            NEED_VALUE();
            rc = parse_int(a, v, 1, &o->n_threads);
        } else if (IS("-c", "--ctx-size")) {
            NEED_VALUE();
            rc = parse_int(a, v, 1, &o->n_ctx);
        } else if (IS("-b", "--batch-size")) {
            NEED_VALUE();
            rc = parse_int(a, v, 1, &o->n_batch);
        } else if (IS(NULL, "--temp")) {
            NEED_VALUE();
            rc = parse_float(a, v, &o->sampling.temperature);
        } else if (IS(NULL, "--top-k")) {
            NEED_VALUE();
            rc = parse_int(a, v, 0, &o->sampling.top_k);
        } else if (IS(NULL, "--top-p")) {
            NEED_VALUE();
            rc = parse_float(a, v, &o->sampling.top_p);
        } else if (IS(NULL, "--min-p")) {
            NEED_VALUE();
            rc = parse_float(a, v, &o->sampling.min_p);
        } else if (IS(NULL, "--repeat-penalty")) {
            NEED_VALUE();
            rc = parse_float(a, v, &o->sampling.repeat_penalty);
        } else if (IS(NULL, "--frequency-penalty")) {
            NEED_VALUE();
            rc = parse_float(a, v, &o->sampling.frequency_penalty);
        } else if (IS(NULL, "--presence-penalty")) {
            NEED_VALUE();
            rc = parse_float(a, v, &o->sampling.presence_penalty);
        } else if (IS(NULL, "--repeat-last-n")) {
            NEED_VALUE();
            rc = parse_int(a, v, -1, &o->sampling.repeat_last_n);
        } else if (IS(NULL, "--min-keep")) {
            NEED_VALUE();
            rc = parse_int(a, v, 0, &o->sampling.min_keep);
        } else if (IS(NULL, "--typical")) {
            NEED_VALUE();
            rc = parse_float(a, v, &o->sampling.typical_p);
        } else if (IS(NULL, "--top-nsigma")) {
            NEED_VALUE();
            rc = parse_float(a, v, &o->sampling.top_n_sigma);
        } else if (IS(NULL, "--xtc-probability")) {
            NEED_VALUE();
            rc = parse_float(a, v, &o->sampling.xtc_probability);
        } else if (IS(NULL, "--xtc-threshold")) {
            NEED_VALUE();
            rc = parse_float(a, v, &o->sampling.xtc_threshold);
        } else if (IS(NULL, "--dynatemp-range")) {
            NEED_VALUE();
            rc = parse_float(a, v, &o->sampling.dynatemp_range);
        } else if (IS(NULL, "--dynatemp-exp")) {
            NEED_VALUE();
            rc = parse_float(a, v, &o->sampling.dynatemp_exponent);
        } else if (IS(NULL, "--dry-multiplier")) {
            NEED_VALUE();
            rc = parse_float(a, v, &o->sampling.dry_multiplier);
        } else if (IS(NULL, "--dry-base")) {
            NEED_VALUE();
            rc = parse_float(a, v, &o->sampling.dry_base);
        } else if (IS(NULL, "--dry-allowed-length")) {
            NEED_VALUE();
            rc = parse_int(a, v, 0, &o->sampling.dry_allowed_length);
        } else if (IS(NULL, "--dry-penalty-last-n")) {
            NEED_VALUE();
            rc = parse_int(a, v, -1, &o->sampling.dry_penalty_last_n);
        } else if (IS(NULL, "--dry-sequence-breaker")) {
            NEED_VALUE();
            if (strcmp(v, "none") == 0) {
                o->dry_none = true;
            } else if (o->n_dry_breakers == DRYBREAK_MAX) {
                fprintf(stderr, "llms-run: at most %d --dry-sequence-breaker\n", DRYBREAK_MAX);
                return -1;
            } else {
                o->dry_breakers[o->n_dry_breakers++] = v;
            }
        } else if (IS(NULL, "--mirostat")) {
            NEED_VALUE();
            rc = parse_int(a, v, 0, &o->sampling.mirostat);
        } else if (IS(NULL, "--mirostat-lr")) {
            NEED_VALUE();
            rc = parse_float(a, v, &o->sampling.mirostat_eta);
        } else if (IS(NULL, "--mirostat-ent")) {
            NEED_VALUE();
            rc = parse_float(a, v, &o->sampling.mirostat_tau);
        } else if (IS(NULL, "--samplers") || IS(NULL, "--sampling-seq")) {
            NEED_VALUE();
            rc = parse_order(a, v, IS(NULL, "--sampling-seq"), &o->sampling);
        } else if (IS("-s", "--seed")) {
            int seed;
            NEED_VALUE();
            rc = parse_int(a, v, 0, &seed);
            o->sampling.seed = (uint64_t)seed;
        } else if (IS(NULL, "--stop")) {
            NEED_VALUE();
            if (o->n_stop == STOP_MAX) {
                fprintf(stderr, "llms-run: at most %d --stop strings\n", STOP_MAX);
                return -1;
            }
            o->stop[o->n_stop++] = v;
        } else if (IS(NULL, "--lora") || IS(NULL, "--lora-scaled")) {
            NEED_VALUE();
            if (o->n_lora == MODEL_LORA_MAX) {
                fprintf(stderr, "llms-run: at most %d adapters\n", MODEL_LORA_MAX);
                return -1;
            }
            o->lora[o->n_lora] = v;
            o->lora_scale[o->n_lora] = 1.0f;
            if (IS(NULL, "--lora-scaled")) {
                if (i + 1 >= argc) {
                    fprintf(stderr, "llms-run: --lora-scaled needs a file and a scale\n");
                    return -1;
                }
                rc = parse_float(a, argv[++i], &o->lora_scale[o->n_lora]);
            }
            o->n_lora++;
        } else if (IS(NULL, "--mmap")) {
            o->load = GGUF_LOAD_MAP;
        } else if (IS("-dev", "--device")) {
            char err[ERR_MAX];
            NEED_VALUE();
            if ((rc = cuda_parse_device(v, &o->device, err)) < 0)
                fprintf(stderr, "llms-run: %s\n", err);
        } else if (IS(NULL, "--no-mmap")) {
            o->load = GGUF_LOAD_COPY;
        } else if (IS(NULL, "--plan")) {
            o->plan = true;
        } else if (IS(NULL, "--prompt-tokens")) {
            NEED_VALUE();
            rc = parse_int(a, v, 1, &o->plan_tokens);
        } else if (IS(NULL, "--prefill-budget-mb")) {
            NEED_VALUE();
            rc = parse_int(a, v, 1, &o->prefill_budget_mb);
        } else if (IS(NULL, "--resident-small-mb")) {
            NEED_VALUE();
            rc = parse_int(a, v, 0, &o->resident_small_mb);
        } else if (IS(NULL, "--ignore-eos")) {
            o->ignore_eos = true;
        } else if (IS(NULL, "--json")) {
            o->json = true;
        } else if (IS(NULL, "--json-schema")) {
            NEED_VALUE();
            o->json_schema_file = v;
            o->json = true;
        } else if (IS(NULL, "--grammar")) {
            NEED_VALUE();
            o->grammar = v;
        } else if (IS(NULL, "--grammar-file")) {
            NEED_VALUE();
            o->grammar_file = v;
        } else if (IS(NULL, "--chat")) {
            o->chat = true;
        } else if (IS(NULL, "--system")) {
            NEED_VALUE();
            o->system_prompt = v;
        } else if (IS(NULL, "--chat-template")) {
            NEED_VALUE();
            o->chat_template = v;
        } else if (IS(NULL, "--ids")) {
            o->ids = true;
        } else if (IS(NULL, "--tokenize")) {
            o->mode = MODE_TOKENIZE;
        } else if (IS(NULL, "--embed")) {
            o->mode = MODE_EMBED;
        } else if (IS(NULL, "--pooling")) {
            NEED_VALUE();
            o->pooling = v;
            if (strcmp(v, "cls") && strcmp(v, "mean") && strcmp(v, "last")) {
                fprintf(stderr, "llms-run: --pooling: '%s' is not cls, mean or last\n", v);
                return -1;
            }
        } else if (IS(NULL, "--detokenize")) {
            o->mode = MODE_DETOKENIZE;
        } else if (IS(NULL, "--perplexity")) {
            NEED_VALUE();
            o->mode = MODE_PERPLEXITY;
            o->perplexity_file = v;
        } else {
            fprintf(stderr, "llms-run: unknown option '%s' (see --help)\n", a);
            return -1;
        }
        if (rc)
            return -1;
#undef IS
#undef NEED_VALUE
    }
    if (!o->model_path) {
        fprintf(stderr, "llms-run: a model is needed (-m MODEL.gguf)\n");
        return -1;
    }
    if (o->mode == MODE_GENERATE && !o->prompt && !o->prompt_file &&
        !(o->plan && o->plan_tokens)) {
        fprintf(stderr, "llms-run: a prompt is needed (-p TEXT or -f FILE)\n");
        return -1;
    }
    if (o->chat && o->ids) {
        fprintf(stderr, "llms-run: --chat and --ids cannot be combined\n");
        return -1;
    }
    if ((o->grammar && o->grammar_file) || ((o->grammar || o->grammar_file) && o->json)) {
        fprintf(stderr, "llms-run: one of --json, --json-schema, --grammar and --grammar-file\n");
        return -1;
    }
    if (o->chat_template && strcmp(chat_family_name(chat_detect(o->chat_template)),
                                   o->chat_template) != 0) {
        fprintf(stderr, "llms-run: --chat-template: '%s' is none of " CHAT_FAMILY_NAMES "\n",
                o->chat_template);
        return -1;
    }
    return 0;
}

/* Tokenizes text into a freshly allocated array; *n gets the count. */
static int32_t *tokenize_alloc(const tokenizer *tok, const char *text, size_t len,
                               bool add_special, bool parse_special, int *n)
{
    int count = tok_encode(tok, text, len, add_special, parse_special, NULL, 0);
    if (count < 0)
        return NULL;
    int32_t *ids = malloc(sizeof *ids * (size_t)(count ? count : 1));
    if (!ids)
        return NULL;
    if (tok_encode(tok, text, len, add_special, parse_special, ids, count) != count) {
        free(ids);
        return NULL;
    }
    *n = count;
    return ids;
}

/* Parses space-separated token ids, each checked against the vocabulary. */
static int32_t *parse_ids(const char *text, int n_vocab, int *n)
{
    size_t cap = strlen(text) / 2 + 1;
    int32_t *ids = malloc(sizeof *ids * cap);
    int count = 0;
    const char *p = text;
    if (!ids)
        return NULL;
    for (;;) {
        char *end;
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == ',')
            p++;
        if (!*p)
            break;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v >= n_vocab) {
            fprintf(stderr, "llms-run: bad token id near '%.16s' (vocabulary has %d tokens)\n",
                    p, n_vocab);
            free(ids);
            return NULL;
        }
        ids[count++] = (int32_t)v;
        p = end;
    }
    *n = count;
    return ids;
}

static int run_tokenize(const tokenizer *tok)
{
    size_t len;
    int n;
    char err[ERR_MAX];
    char *text = readall_stream(stdin, &len, err);
    if (!text) {
        fprintf(stderr, "llms-run: cannot read stdin: %s\n", err);
        return 1;
    }
    int32_t *ids = tokenize_alloc(tok, text, len, false, false, &n);
    free(text);
    if (!ids) {
        fprintf(stderr, "llms-run: tokenization failed\n");
        return 1;
    }
    for (int i = 0; i < n; i++)
        printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    free(ids);
    return 0;
}

static int run_detokenize(const tokenizer *tok)
{
    size_t len;
    int n;
    char err[ERR_MAX];
    char *text = readall_stream(stdin, &len, err);
    if (!text) {
        fprintf(stderr, "llms-run: cannot read stdin: %s\n", err);
        return 1;
    }
    int32_t *ids = parse_ids(text, tok_n_vocab(tok), &n);
    free(text);
    if (!ids)
        return 1;
    int need = tok_decode(tok, ids, n, false, true, NULL, 0);
    char *out = need >= 0 ? malloc((size_t)need + 1) : NULL;
    if (!out || tok_decode(tok, ids, n, false, true, out, (size_t)need + 1) != need) {
        fprintf(stderr, "llms-run: detokenization failed\n");
        free(ids);
        free(out);
        return 1;
    }
    fwrite(out, 1, (size_t)need, stdout);
    printf("\n");
    free(out);
    free(ids);
    return 0;
}

/* What a generation or scoring run holds: model, runner, KV. */
typedef struct engine_session {
    model *m;
    model_runner *runner;
    kv_pool *pool;
    kv_seq seq;
    int n_ctx;
} engine_session;

static int session_n_ctx(const model *m, const run_options *o)
{
    const model_hparams *hp = model_hparams_of(m);
    return o->n_ctx ? o->n_ctx : (hp->n_ctx < 4096 ? hp->n_ctx : 4096);
}

/* The prefill plan of n_prompt tokens under o's budget and residency (prefill.h). */
static int session_plan(const model *m, const run_options *o, int n_prompt, prefill_plan *p,
                        char err[ERR_MAX])
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int n_ctx = session_n_ctx(m, o);
    prefill_request req = {
        .n_prompt = n_prompt, .max_rows = o->n_batch, .max_kv = n_ctx,
        .n_threads = o->n_threads > 0 ? o->n_threads : online > 0 ? (int)online : 1,
        .kv = KV_F16, .budget = (size_t)o->prefill_budget_mb << 20,
        .resident_small = o->resident_small_mb < 0 ? SIZE_MAX : (size_t)o->resident_small_mb << 20,
    };
    return prefill_plan_make(m, &req, p, err);
}

/* A runner for prompts of n_prompt tokens: as the plan says under a budget or with
 * streamed weights, otherwise n_batch rows per step. */
static int session_open(engine_session *s, model *m, const run_options *o, int n_prompt,
                        char err[ERR_MAX])
{
    memset(s, 0, sizeof *s);
    s->m = m;
    s->n_ctx = session_n_ctx(m, o);
    if (o->prefill_budget_mb > 0 || o->resident_small_mb >= 0) {
        prefill_plan p;
        if (session_plan(m, o, n_prompt, &p, err) < 0)
            return -1;
        model_runner_opts ro = prefill_runner_opts(&p);
        s->runner = model_runner_new_opts(m, &ro, err);
        if (s->runner && o->resident_small_mb >= 0 &&
            model_runner_stream_weights(s->runner, p.req.resident_small, err) < 0) {
            model_runner_free(s->runner);
            return -1;
        }
    } else {
        s->runner = model_runner_new(m, o->n_threads, o->n_batch, s->n_ctx, err);
    }
    if (!s->runner)
        return -1;
    if (o->device >= 0) {
        if (model_runner_use_gpu(s->runner, o->device, err) < 0) {
            model_runner_free(s->runner);
            return -1;
        }
        fprintf(stderr, "llms-run: forward on %s\n", model_runner_gpu_name(s->runner));
    }
    s->pool = kv_pool_new(model_kv_shape(m), 0, err);
    if (!s->pool) {
        model_runner_free(s->runner);
        return -1;
    }
    kv_seq_init(&s->seq, s->pool);
    return 0;
}

static void session_close(engine_session *s)
{
    if (!s->pool) /* never opened */
        return;
    kv_seq_free(&s->seq);
    kv_pool_free(s->pool);
    model_runner_free(s->runner);
}

/* Evaluates tokens at positions first_pos.. and writes the last row's logits. */
static int session_eval(engine_session *s, const int32_t *tokens, int n, int first_pos,
                        int32_t *positions, float *logits, char err[ERR_MAX])
{
    int32_t last = n - 1;
    for (int i = 0; i < n; i++)
        positions[i] = first_pos + i;
    model_batch b = {
        .n_tokens = n,
        .tokens = tokens,
        .positions = positions,
        .n_out = 1,
        .out_rows = &last,
        .logits = logits,
    };
    return model_forward(s->runner, &s->seq, &b, err);
}

/* Builds the prompt text, applying the chat template when asked (its family goes to
 * *family). */
static char *prompt_text(const run_options *o, const model *m, size_t *len,
                         enum chat_family *family)
{
    char *raw;
    if (o->prompt_file) {
        char err[ERR_MAX];
        if (!(raw = readall_file(o->prompt_file, len, err)))
            fprintf(stderr, "llms-run: %s: %s\n", o->prompt_file, err);
    } else {
        raw = strdup(o->prompt);
        *len = strlen(o->prompt);
    }
    if (!raw || !o->chat)
        return raw;

    *family = o->chat_template ? chat_detect(o->chat_template) : chat_detect_file(model_gguf(m));

    struct chat_message msgs[2];
    int n = 0;
    if (o->system_prompt)
        msgs[n++] = (struct chat_message){"system", o->system_prompt};
    msgs[n++] = (struct chat_message){"user", raw};
    int need = chat_apply(*family, msgs, n, true, NULL, 0);
    char *text = need >= 0 ? malloc((size_t)need + 1) : NULL;
    if (text)
        chat_apply(*family, msgs, n, true, text, (size_t)need + 1);
    else
        fprintf(stderr, "llms-run: chat template failed\n");
    free(raw);
    *len = text ? (size_t)need : 0;
    return text;
}

static void emit_text(const char *bytes, long n)
{
    if (n > 0) {
        fwrite(bytes, 1, (size_t)n, stdout);
        fflush(stdout);
    }
}

static bool json_allows(const void *cursor, int32_t token)
{
    return jsonmask_allows(cursor, token);
}

static bool grammar_allows_token(const void *cursor, int32_t token)
{
    return grammar_allows(cursor, token);
}

/* --grammar or --grammar-file compiled into *out (NULL without either): 0, or -1 after
 * saying why on stderr. */
static int grammar_of_options(const run_options *o, grammar **out)
{
    char err[ERR_MAX];
    *out = NULL;
    if (o->grammar) {
        if (grammar_compile(o->grammar, strlen(o->grammar), out, err) == 0)
            return 0;
        fprintf(stderr, "llms-run: --grammar: %s\n", err);
        return -1;
    }
    if (!o->grammar_file)
        return 0;
    size_t len;
    char *text = readall_file(o->grammar_file, &len, err);
    int rc = text ? grammar_compile(text, len, out, err) : -1;
    free(text);
    if (rc)
        fprintf(stderr, "llms-run: --grammar-file %s: %s\n", o->grammar_file, err);
    return rc;
}

/* The sampler of the options, DRY's breakers (llama.cpp's unless given) made from the
 * vocabulary, DRY looking back over at most n_ctx: 0, or -1 after saying why. */
static int sampler_of_options(const run_options *o, const tokenizer *tok, int n_vocab, int n_ctx,
                              sampler **out)
{
    char err[ERR_MAX];
    sampler_params p = o->sampling;
    sampler_breaker *brk = NULL;
    p.n_ctx = n_ctx;
    if (p.dry_multiplier != 0.0f && p.dry_penalty_last_n != 0 && !p.mirostat && !o->dry_none &&
        drybreak_tokens(tok, o->n_dry_breakers ? o->dry_breakers : drybreak_default,
                        o->n_dry_breakers ? o->n_dry_breakers : DRYBREAK_N_DEFAULT, &brk,
                        &p.n_dry_breakers, err)) {
        fprintf(stderr, "llms-run: %s\n", err);
        return -1;
    }
    p.dry_breakers = brk;
    *out = sampler_new(n_vocab, &p, err);
    free(brk);
    if (!*out)
        fprintf(stderr, "llms-run: %s\n", err);
    return *out ? 0 : -1;
}

static int run_generate(model *m, const tokenizer *tok, const run_options *o)
{
    char err[ERR_MAX];
    const int n_vocab = model_hparams_of(m)->n_vocab;
    int n_prompt = 0, status = 1;
    int32_t *prompt = NULL, *history = NULL, *positions = NULL;
    float *logits = NULL;
    char *piece = NULL, *shown = NULL; /* a token's text, what the stop strings let by */
    size_t piece_cap = tok_max_piece_len(tok) + 1;
    sampler *smp = NULL;
    jsonmask_vocab *json_vocab = NULL;
    jsonschema *schema = NULL;
    jsonmask_cursor json;
    grammar *gram = NULL;
    grammar_vocab *gram_vocab = NULL;
    grammar_cursor *gram_cursor = NULL;
    sampler_constraint allowed = {json_allows, &json};
    bool constrained = o->json;
    stop_matcher stop;
    engine_session s = {0};

    size_t len;
    enum chat_family family = CHAT_PLAIN;
    char *text = prompt_text(o, m, &len, &family);
    if (text && o->ids)
        prompt = parse_ids(text, n_vocab, &n_prompt);
    else if (text)
        prompt = tokenize_alloc(tok, text, len, true, true, &n_prompt);
    free(text);
    if (!prompt)
        goto out;
    if (n_prompt == 0) {
        fprintf(stderr, "llms-run: the prompt has no tokens\n");
        goto out;
    }
    if (n_prompt + o->n_predict > session_n_ctx(m, o)) {
        fprintf(stderr, "llms-run: prompt (%d tokens) + %d to generate exceed the context (%d)\n",
                n_prompt, o->n_predict, session_n_ctx(m, o));
        goto out;
    }
    /* under a budget the prompt is refused here, before any compute, when it cannot fit */
    if (session_open(&s, m, o, n_prompt, err)) {
        fprintf(stderr, "llms-run: %s\n", err);
        goto out;
    }
    /* A chat turn ends at the template's end-of-turn text even when the tokenizer does
     * not mark that token as end-of-generation. */
    const char *stops[STOP_MAX];
    int n_stops = o->n_stop;
    memcpy(stops, o->stop, sizeof *stops * (size_t)n_stops);
    if (o->chat && n_stops < STOP_MAX)
        stops[n_stops++] = chat_stop_text(family);
    if (stop_init(&stop, stops, n_stops, err)) {
        fprintf(stderr, "llms-run: --stop: %s\n", err);
        goto out;
    }
    if (o->json_schema_file) {
        size_t len;
        char *text = readall_file(o->json_schema_file, &len, err);
        int rc = text ? jsonschema_compile(text, len, &schema, err) : -1;
        free(text);
        if (rc) {
            fprintf(stderr, "llms-run: --json-schema %s: %s\n", o->json_schema_file, err);
            goto out;
        }
    }
    if (o->json) {
        if (jsonmask_vocab_new(tok, &json_vocab, err)) {
            fprintf(stderr, "llms-run: --json: %s\n", err);
            goto out;
        }
        jsonmask_cursor_init_schema(&json, json_vocab, schema ? schema : jsonschema_any_object());
    }
    if (grammar_of_options(o, &gram))
        goto out;
    if (gram) {
        if (grammar_vocab_new(tok, &gram_vocab, err) ||
            grammar_cursor_new(gram, gram_vocab, &gram_cursor, err)) {
            fprintf(stderr, "llms-run: --grammar: %s\n", err);
            goto out;
        }
        allowed = (sampler_constraint){grammar_allows_token, gram_cursor};
        constrained = true;
    }
    if (sampler_of_options(o, tok, n_vocab, session_n_ctx(m, o), &smp))
        goto out;
    history = malloc(sizeof *history * (size_t)(n_prompt + o->n_predict));
    positions = malloc(sizeof *positions * (size_t)n_prompt);
    logits = malloc(sizeof *logits * (size_t)n_vocab);
    piece = malloc(piece_cap);
    shown = malloc(STOP_OUT_CAP(piece_cap));
    if (!history || !positions || !logits || !piece || !shown) {
        fprintf(stderr, "llms-run: out of memory\n");
        goto out;
    }
    memcpy(history, prompt, sizeof *prompt * (size_t)n_prompt);

    double t0 = clock_mono_s();
    if (session_eval(&s, prompt, n_prompt, 0, positions, logits, err)) {
        fprintf(stderr, "llms-run: prefill: %s\n", err);
        goto out;
    }
    double t_prefill = clock_mono_s() - t0;

    /* the first token comes from the prompt's logits: the decode rate counts the forward
     * passes (n_eval), one fewer than the tokens when no stop cuts the reply short */
    int n_hist = n_prompt, n_gen = 0, n_eval = 0;
    t0 = clock_mono_s();
    while (n_gen < o->n_predict) {
        int32_t next = constrained ? sampler_sample_allowed(smp, logits, history, n_hist, &allowed)
                                   : sampler_sample(smp, logits, history, n_hist);
        if (o->json && jsonmask_take(&json, next) < 0) {
            fprintf(stderr, "\nllms-run: --json: no token of the vocabulary continues the "
                            "JSON text\n");
            goto out;
        }
        if (gram && grammar_take(gram_cursor, next) < 0) {
            fprintf(stderr, "\nllms-run: --grammar: no token of the vocabulary continues a "
                            "sentence of the grammar\n");
            goto out;
        }
        if (!o->ignore_eos && tok_is_eog(tok, next))
            break;
        history[n_hist++] = next;
        n_gen++;
        if (o->ids) {
            printf(n_gen > 1 ? " %d" : "%d", next);
            fflush(stdout);
        } else {
            int len = tok_piece(tok, next, piece, piece_cap);
            emit_text(shown, stop_feed(&stop, piece, len > 0 ? (size_t)len : 0, shown,
                                       STOP_OUT_CAP(piece_cap)));
            if (stop_hit(&stop) >= 0)
                break;
        }
        if (n_gen == o->n_predict || (o->json && jsonmask_complete(&json.state)) ||
            (gram && grammar_finished(gram_cursor)))
            break;
        int32_t pos = n_hist - 1;
        if (session_eval(&s, &next, 1, pos, positions, logits, err)) {
            fprintf(stderr, "\nllms-run: decode: %s\n", err);
            goto out;
        }
        n_eval++;
    }
    double t_decode = clock_mono_s() - t0;
    if (!o->ids)
        emit_text(shown, (long)stop_flush(&stop, shown));
    printf("\n");
    fflush(stdout);
    fprintf(stderr,
            "prefill: %d tokens in %.3f s, %.2f tok/s\n"
            "decode:  %d tokens (%d forward passes) in %.3f s, %.2f tok/s\n",
            n_prompt, t_prefill, n_prompt / t_prefill, n_gen, n_eval, t_decode,
            n_eval > 0 ? n_eval / t_decode : 0.0);
    status = 0;
out:
    free(logits);
    free(piece);
    free(shown);
    free(positions);
    free(history);
    free(prompt);
    sampler_free(smp);
    jsonmask_vocab_free(json_vocab);
    jsonschema_free(schema);
    grammar_cursor_free(gram_cursor);
    grammar_vocab_free(gram_vocab);
    grammar_free(gram);
    session_close(&s);
    return status;
}

/* Prints the prefill plan of the prompt (or of --prompt-tokens), computing nothing. */
static int run_plan(model *m, const tokenizer *tok, const run_options *o)
{
    char err[ERR_MAX];
    int n_prompt = o->plan_tokens;
    if (n_prompt == 0) {
        size_t len;
        enum chat_family family = CHAT_PLAIN;
        char *text = prompt_text(o, m, &len, &family);
        int32_t *ids = NULL;
        if (text)
            ids = o->ids ? parse_ids(text, model_hparams_of(m)->n_vocab, &n_prompt)
                         : tokenize_alloc(tok, text, len, true, true, &n_prompt);
        free(text);
        free(ids);
        if (!ids || n_prompt == 0) {
            fprintf(stderr, "llms-run: --plan needs a prompt (-p, -f) or --prompt-tokens\n");
            return 1;
        }
    }
    prefill_plan p;
    if (session_plan(m, o, n_prompt, &p, err) < 0) {
        fprintf(stderr, "llms-run: %s\n", err);
        return 1;
    }
    prefill_plan_print(&p, stdout);
    return 0;
}

/* log(softmax(logits)[target]) in double precision. */
static double log_prob(const float *logits, int n_vocab, int32_t target)
{
    double max = logits[0], sum = 0.0;
    for (int i = 1; i < n_vocab; i++)
        if (logits[i] > max)
            max = logits[i];
    for (int i = 0; i < n_vocab; i++)
        sum += exp((double)logits[i] - max);
    return (double)logits[target] - max - log(sum);
}

/*
 * llama-perplexity's method: the text (with BOS) is cut into chunks of n_ctx tokens,
 * each evaluated from an empty context with its first token replaced by BOS, and only
 * the predictions of its second half are scored.
 */
static int run_perplexity(model *m, const tokenizer *tok, const run_options *o)
{
    char err[ERR_MAX];
    size_t len;
    int n_tokens, status = 1;
    const int n_vocab = model_hparams_of(m)->n_vocab;
    engine_session s;
    char *text = readall_file(o->perplexity_file, &len, err);
    if (!text) {
        fprintf(stderr, "llms-run: %s: %s\n", o->perplexity_file, err);
        return 1;
    }
    int32_t *tokens = tokenize_alloc(tok, text, len, true, false, &n_tokens);
    free(text);
    if (!tokens) {
        fprintf(stderr, "llms-run: tokenization failed\n");
        return 1;
    }
    if (session_open(&s, m, o, session_n_ctx(m, o), err)) {
        fprintf(stderr, "llms-run: %s\n", err);
        free(tokens);
        return 1;
    }
    const int n_ctx = s.n_ctx, first = n_ctx / 2, n_scored = n_ctx - 1 - first;
    const int n_chunk = n_tokens / n_ctx;
    int32_t *chunk = malloc(sizeof *chunk * (size_t)n_ctx);
    int32_t *positions = malloc(sizeof *positions * (size_t)n_ctx);
    int32_t *rows = malloc(sizeof *rows * (size_t)n_scored);
    float *logits = malloc(sizeof *logits * (size_t)n_scored * (size_t)n_vocab);
    if (!chunk || !positions || !rows || !logits) {
        fprintf(stderr, "llms-run: out of memory\n");
        goto out;
    }
    if (n_tokens < 2 * n_ctx) {
        fprintf(stderr, "llms-run: need at least %d tokens for -c %d, the text has %d\n",
                2 * n_ctx, n_ctx, n_tokens);
        goto out;
    }
    fprintf(stderr, "perplexity: %d tokens, %d chunks of %d, scoring %d per chunk\n",
            n_tokens, n_chunk, n_ctx, n_scored);

    double nll = 0.0, nll2 = 0.0;
    long count = 0;
    double t0 = clock_mono_s();
    for (int c = 0; c < n_chunk; c++) {
        memcpy(chunk, tokens + (size_t)c * n_ctx, sizeof *chunk * (size_t)n_ctx);
        if (tok_add_bos(tok) && tok_bos(tok) >= 0)
            chunk[0] = tok_bos(tok);
        for (int i = 0; i < n_ctx; i++)
            positions[i] = i;
        for (int i = 0; i < n_scored; i++)
            rows[i] = first + i;
        model_batch b = {
            .n_tokens = n_ctx,
            .tokens = chunk,
            .positions = positions,
            .n_out = n_scored,
            .out_rows = rows,
            .logits = logits,
        };
        kv_seq_truncate(&s.seq, 0);
        if (model_forward(s.runner, &s.seq, &b, err)) {
            fprintf(stderr, "llms-run: chunk %d: %s\n", c, err);
            goto out;
        }
        for (int i = 0; i < n_scored; i++) {
            int32_t target = tokens[(size_t)c * n_ctx + first + i + 1];
            double lp = -log_prob(logits + (size_t)i * n_vocab, n_vocab, target);
            nll += lp;
            nll2 += lp * lp;
            count++;
        }
        fprintf(stderr, "[%d]%.4f%s", c + 1, exp(nll / count), c + 1 == n_chunk ? "\n" : ",");
        /* A long text takes minutes: after the first chunk, say how many. */
        if (c == 0 && n_chunk > 1 && isatty(STDERR_FILENO))
            fprintf(stderr, " (%.2f s per chunk, about %.0f s left) ", clock_mono_s() - t0,
                    (clock_mono_s() - t0) * (n_chunk - 1));
    }
    double mean = nll / count, var = nll2 / count - mean * mean;
    double ppl = exp(mean);
    double ppl_err = count > 1 && var > 0 ? ppl * sqrt(var / (count - 1)) : 0.0;
    fprintf(stderr, "perplexity: %.2f s for %d chunks\n", clock_mono_s() - t0, n_chunk);
    printf("PPL = %.4f +/- %.5f\n", ppl, ppl_err);
    status = 0;
out:
    free(logits);
    free(rows);
    free(positions);
    free(chunk);
    free(tokens);
    session_close(&s);
    return status;
}

/* Prints dim values on one line, as llama-embedding's default output does. */
static void print_embedding(const float *v, int dim, int n_tokens)
{
    for (int i = 0; i < dim; i++)
        printf(i ? " %.6f" : "%.6f", (double)v[i]);
    printf("\n");
    fprintf(stderr, "embed: %d tokens, %d dimensions\n", n_tokens, dim);
}

/* stdin's text, less one trailing newline (what echo adds). */
static char *read_embed_text(size_t *len)
{
    char err[ERR_MAX];
    char *text = readall_stream(stdin, len, err);
    if (!text) {
        fprintf(stderr, "llms-run: cannot read stdin: %s\n", err);
        return NULL;
    }
    if (*len > 0 && text[*len - 1] == '\n')
        text[--*len] = 0;
    return text;
}

static int run_embed_bert(const char *path, const run_options *o)
{
    char err[ERR_MAX];
    int status = 1, n = 0;
    size_t len;
    tokenizer *tok = NULL;
    bert_runner *r = NULL;
    int32_t *ids = NULL;
    float *out = NULL;
    char *text = NULL;
    bert_model *m = bert_load(path, err);
    if (!m) {
        fprintf(stderr, "llms-run: %s: %s\n", path, err);
        return 1;
    }
    const bert_hparams *hp = bert_hparams_of(m);
    enum bert_pooling how = !o->pooling ? hp->pooling
                            : !strcmp(o->pooling, "cls") ? BERT_POOL_CLS
                            : !strcmp(o->pooling, "mean") ? BERT_POOL_MEAN : BERT_POOL_LAST;
    if (tok_load(bert_gguf(m), &tok, err)) {
        fprintf(stderr, "llms-run: %s: tokenizer: %s\n", path, err);
        goto out;
    }
    if (!(text = read_embed_text(&len)))
        goto out;
    if (!(ids = tokenize_alloc(tok, text, len, true, false, &n)) || n == 0) {
        fprintf(stderr, "llms-run: the text has no tokens\n");
        goto out;
    }
    if (n > hp->n_pos) {
        fprintf(stderr, "llms-run: %d tokens, the model takes at most %d\n", n, hp->n_pos);
        goto out;
    }
    if (!(r = bert_runner_new(m, o->n_threads, n, err)) ||
        !(out = malloc(sizeof *out * (size_t)hp->dim)) ||
        bert_embed(r, 1, &n, ids, NULL, how, out, err) < 0) {
        fprintf(stderr, "llms-run: embed: %s\n", out ? err : "out of memory");
        goto out;
    }
    print_embedding(out, hp->dim, n);
    status = 0;
out:
    free(out);
    free(ids);
    free(text);
    bert_runner_free(r);
    tok_free(tok);
    bert_free(m);
    return status;
}

static int run_embed_decoder(model *m, const tokenizer *tok, const run_options *o)
{
    char err[ERR_MAX];
    const model_hparams *hp = model_hparams_of(m);
    int status = 1, n = 0, n_ctx = o->n_ctx ? o->n_ctx : (hp->n_ctx < 4096 ? hp->n_ctx : 4096);
    size_t len;
    kv_pool *pool = NULL;
    embedder *e = NULL;
    float *out = NULL;
    char *text = NULL;
    enum embed_pooling pooling = EMBED_LAST;
    if (o->pooling)
        pooling = !strcmp(o->pooling, "cls")    ? EMBED_CLS
                  : !strcmp(o->pooling, "mean") ? EMBED_MEAN
                                                : EMBED_LAST;
    else if (embed_pooling_of_model(m, &pooling, err) < 0) {
        fprintf(stderr, "llms-run: %s\n", err);
        return 1;
    }
    model_runner *r = model_runner_new(m, o->n_threads, o->n_batch, n_ctx, err);
    if (!r || !(pool = kv_pool_new(model_kv_shape(m), 0, err)) ||
        !(e = embed_new(m, r, pool, err))) {
        fprintf(stderr, "llms-run: %s\n", err);
        goto out;
    }
    if (!(text = read_embed_text(&len)))
        goto out;
    if (!(out = malloc(sizeof *out * (size_t)hp->dim))) {
        fprintf(stderr, "llms-run: out of memory\n");
        goto out;
    }
    if (embed_text(e, tok, text, pooling, out, &n, err) < 0) {
        fprintf(stderr, "llms-run: embed: %s\n", err);
        goto out;
    }
    print_embedding(out, hp->dim, n);
    status = 0;
out:
    free(out);
    free(text);
    embed_free(e);
    kv_pool_free(pool);
    model_runner_free(r);
    return status;
}

int main(int argc, char **argv)
{
    run_options o;
    char err[ERR_MAX];
    tokenizer *tok = NULL;
    int status;

    if (parse_args(argc, argv, &o))
        return 2;

    if (o.mode == MODE_TOKENIZE || o.mode == MODE_DETOKENIZE) {
        /* Vocabulary-only files have no weights: read the tokenizer alone. */
        gguf_file *g = gguf_open(o.model_path, err);
        if (!g) {
            fprintf(stderr, "llms-run: %s: %s\n", o.model_path, err);
            return 1;
        }
        if (tok_load(g, &tok, err)) {
            fprintf(stderr, "llms-run: %s: %s\n", o.model_path, err);
            gguf_close(g);
            return 1;
        }
        gguf_close(g);
        status = o.mode == MODE_TOKENIZE ? run_tokenize(tok) : run_detokenize(tok);
        tok_free(tok);
        return status;
    }

    if (o.mode == MODE_EMBED) {
        gguf_file *g = gguf_open(o.model_path, err);
        if (!g) {
            fprintf(stderr, "llms-run: %s: %s\n", o.model_path, err);
            return 1;
        }
        bool encoder = bert_is_encoder(g);
        gguf_close(g);
        if (encoder)
            return run_embed_bert(o.model_path, &o);
    }

    model *base = model_load_as(o.model_path, o.load, err), *m = base;
    lora *adapters[MODEL_LORA_MAX] = {0};
    if (!base) {
        fprintf(stderr, "llms-run: %s: %s\n", o.model_path, err);
        return 1;
    }
    /* adapters: a view of the base that adds their deltas, unmerged */
    for (int i = 0; i < o.n_lora && m; i++)
        if (!(adapters[i] = lora_load(base, o.lora[i], err)))
            m = NULL;
    if (m && o.n_lora &&
        !(m = model_with_loras(base, o.n_lora, (const lora *const *)adapters, o.lora_scale, err)))
        m = NULL;
    if (!m || tok_load(model_gguf(m), &tok, err)) {
        fprintf(stderr, "llms-run: %s%s\n", m ? "tokenizer: " : "", err);
        if (m != base)
            model_free(m);
        for (int i = 0; i < o.n_lora; i++)
            lora_free(adapters[i]);
        model_free(base);
        return 1;
    }
    if (o.plan)
        status = run_plan(m, tok, &o);
    else if (o.mode == MODE_PERPLEXITY)
        status = run_perplexity(m, tok, &o);
    else if (o.mode == MODE_EMBED)
        status = run_embed_decoder(m, tok, &o);
    else
        status = run_generate(m, tok, &o);
    tok_free(tok);
    if (m != base)
        model_free(m);
    for (int i = 0; i < o.n_lora; i++)
        lora_free(adapters[i]);
    model_free(base);
    return status;
}
