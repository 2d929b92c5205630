/*
 * tokenizer.c — loading a tokenizer from GGUF metadata, special-token splitting,
 * encoding dispatch, pieces and decoding (see tokenizer.h). The per-model encoders
 * live in tok_spm.c, tok_bpe.c, tok_wpm.c and tok_ugm.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tok/tok_internal.h"

/* ---- UTF-8 ---- */

uint32_t tok_utf8_decode(const char *s, size_t n, size_t *used)
{
    const unsigned char *u = (const unsigned char *)s;
    *used = 1;
    if (!(u[0] & 0x80))
        return u[0];
    size_t len = (u[0] & 0xe0) == 0xc0   ? 2
                 : (u[0] & 0xf0) == 0xe0 ? 3
                 : (u[0] & 0xf8) == 0xf0 ? 4
                                         : 0;
    if (len == 0 || len > n)
        return 0xfffd;
    uint32_t cp = u[0] & (0x7f >> len);
    for (size_t i = 1; i < len; i++) {
        if ((u[i] & 0xc0) != 0x80)
            return 0xfffd;
        cp = cp << 6 | (u[i] & 0x3f);
    }
    *used = len;
    return cp;
}

/* ---- text -> id map ---- */

static uint32_t text_hash(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return (uint32_t)(h ^ h >> 32);
}

static bool text_is(const tokenizer *t, int32_t id, const char *s, size_t n)
{
    return t->text_len[id] == n && memcmp(t->text + t->text_off[id], s, n) == 0;
}

int32_t tok_lookup(const tokenizer *t, const char *s, size_t n)
{
    for (uint32_t i = text_hash(s, n) & t->map_mask;; i = (i + 1) & t->map_mask) {
        int32_t id = t->map[i];
        if (id < 0 || text_is(t, id, s, n))
            return id;
    }
}

static int build_map(tokenizer *t, char err[ERR_MAX])
{
    uint32_t cap = 16;
    while (cap < 2 * (uint64_t)t->n_vocab)
        cap *= 2;
    t->map = malloc(cap * sizeof *t->map);
    if (!t->map)
        return err_set(err, "out of memory for the token map");
    memset(t->map, 0xff, cap * sizeof *t->map);
    t->map_mask = cap - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const char *s = t->text + t->text_off[id];
        size_t n = t->text_len[id];
        uint32_t i = text_hash(s, n) & t->map_mask;
        while (t->map[i] >= 0 && !text_is(t, t->map[i], s, n))
            i = (i + 1) & t->map_mask;
        t->map[i] = id; /* a repeated text maps to its last token */
    }
    return 0;
}

/* ---- loading ---- */

static int load_tokens(tokenizer *t, const gguf_file *g, char err[ERR_MAX])
{
    static const char *key = "tokenizer.ggml.tokens";
    enum gguf_value_type et;
    uint64_t n;
    if (!gguf_get_arr(g, key, &et, &n) || et != GGUF_STRING)
        return err_set(err, "%s: missing or not a string array", key);
    if (n == 0 || n > INT32_MAX / 4)
        return err_set(err, "%s: bad vocabulary size %llu", key, (unsigned long long)n);
    t->n_vocab = (int32_t)n;

    uint64_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s;
        if (!gguf_arr_str(g, key, i, &s))
            return err_set(err, "%s[%llu]: unreadable", key, (unsigned long long)i);
        total += s.len + 1;
        if (s.len > t->max_token_len)
            t->max_token_len = s.len;
    }
    if (total > UINT32_MAX)
        return err_set(err, "%s: token texts too large (%llu bytes)", key,
                       (unsigned long long)total);
    t->text = malloc(total);
    t->text_off = malloc(n * sizeof *t->text_off);
    t->text_len = malloc(n * sizeof *t->text_len);
    t->scores = calloc(n, sizeof *t->scores);
    t->types = malloc(n);
    t->flags = calloc(n, 1);
    if (!t->text || !t->text_off || !t->text_len || !t->scores || !t->types || !t->flags)
        return err_set(err, "out of memory for %llu tokens", (unsigned long long)n);
    uint32_t off = 0;
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s;
        gguf_arr_str(g, key, i, &s);
        memcpy(t->text + off, s.ptr, s.len);
        t->text[off + s.len] = 0;
        t->text_off[i] = off;
        t->text_len[i] = (uint32_t)s.len;
        off += (uint32_t)s.len + 1;
    }

    if (gguf_find_key(g, "tokenizer.ggml.scores") >= 0 &&
        !gguf_arr_f32(g, "tokenizer.ggml.scores", t->scores, n))
        return err_set(err, "tokenizer.ggml.scores: not a numeric array of %llu elements",
                       (unsigned long long)n);

    memset(t->types, TOK_TYPE_NORMAL, n);
    if (gguf_find_key(g, "tokenizer.ggml.token_type") >= 0) {
        int32_t *types = malloc(n * sizeof *types);
        if (!types)
            return err_set(err, "out of memory for token types");
        if (!gguf_arr_i32(g, "tokenizer.ggml.token_type", types, n)) {
            free(types);
            return err_set(err, "tokenizer.ggml.token_type: not an integer array of %llu elements",
                           (unsigned long long)n);
        }
        for (uint64_t i = 0; i < n; i++) {
            if (types[i] < TOK_TYPE_NORMAL || types[i] > TOK_TYPE_BYTE) {
                int32_t bad = types[i];
                free(types);
                return err_set(err, "tokenizer.ggml.token_type[%llu] = %d: not a token type (1..6)",
                               (unsigned long long)i, bad);
            }
            t->types[i] = (uint8_t)types[i];
        }
        free(types);
    }
    return 0;
}

/* Reads a special token id; -1 (or 0xFFFFFFFF) in the file means "none". Returns 1 when
 * the key was present, 0 when absent, -1 on error. */
static int read_id(const tokenizer *t, const gguf_file *g, const char *key, int32_t *id,
                   char err[ERR_MAX])
{
    if (gguf_find_key(g, key) < 0)
        return 0;
    int64_t v;
    if (!gguf_get_i64(g, key, &v))
        return err_set(err, "%s: not an integer", key);
    if (v == -1 || v == UINT32_MAX) {
        *id = -1;
        return 1;
    }
    if (v < 0 || v >= t->n_vocab)
        return err_set(err, "%s = %lld: outside the vocabulary (%d tokens)", key, (long long)v,
                       t->n_vocab);
    *id = (int32_t)v;
    return 1;
}

static int read_flag(const gguf_file *g, const char *key, bool *flag, char err[ERR_MAX])
{
    if (gguf_find_key(g, key) >= 0 && !gguf_get_bool(g, key, flag))
        return err_set(err, "%s: not a boolean", key);
    return 0;
}

/* The flagged tokens in id order, so that a sampler can ban them without a scan of the
 * vocabulary (load_specials flags at most TOK_EOG_MAX). */
static void list_eog_tokens(tokenizer *t)
{
    t->n_eog = 0;
    for (int32_t e = 0; e < t->n_vocab && t->n_eog < TOK_EOG_MAX; e++)
        if (t->flags[e] & TOK_FLAG_EOG)
            t->eog[t->n_eog++] = e;
}

/* The id of the control or user-defined token spelled text, or -1. */
static int32_t markup_token(const tokenizer *t, const char *text)
{
    int32_t e = tok_lookup(t, text, strlen(text));
    return e >= 0 && (t->types[e] == TOK_TYPE_CONTROL || t->types[e] == TOK_TYPE_USER_DEFINED)
               ? e
               : -1;
}

/*
 * gpt-oss's harmony format (o200k_harmony), as llama.cpp's vocabulary loading treats it:
 * where "<|return|>" and "<|call|>" end generation beside "<|end|>", "<|end|>" ends a
 * message and not the reply (the analysis channel's message ends with it, and the final
 * channel's follows), so it is no end of generation; it and the markup between messages
 * ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>") become user-defined tokens,
 * which a reply's text shows, so that the reply's channels can be told apart. Taken after
 * every end-of-generation token is flagged, as llama.cpp takes "<|end|>" off its list
 * (the special ids stay: EOT may still name "<|end|>", as llama.cpp's does). Other
 * vocabularies are left as they are.
 */
static void harmony_markup(tokenizer *t)
{
    int32_t ret = markup_token(t, "<|return|>"), call = markup_token(t, "<|call|>");
    int32_t end = markup_token(t, "<|end|>");
    if (ret < 0 || call < 0 || end < 0)
        return;
    t->flags[end] &= (uint8_t)~TOK_FLAG_EOG;
    static const char *const shown[] = {"<|end|>", "<|start|>", "<|channel|>", "<|message|>",
                                        "<|constrain|>"};
    for (size_t i = 0; i < sizeof shown / sizeof *shown; i++) {
        int32_t e = markup_token(t, shown[i]);
        if (e >= 0)
            t->types[e] = TOK_TYPE_USER_DEFINED;
    }
}

/* The ids a tokenizer model's files usually have, for files that name none (dropped where
 * the vocabulary is smaller), and whether it adds BOS, EOS, SEP and a space prefix. */
static void default_specials(tokenizer *t)
{
    int32_t *id = t->special_id;
    for (int i = 0; i < TOK_SPECIAL_COUNT; i++)
        id[i] = -1;
    switch (t->model) {
    case TOK_MODEL_SPM:
        id[TOK_SPECIAL_BOS] = 1, id[TOK_SPECIAL_EOS] = 2, id[TOK_SPECIAL_UNK] = 0;
        t->add_bos = true, t->add_space_prefix = true;
        break;
    case TOK_MODEL_BPE:
        id[TOK_SPECIAL_BOS] = 11, id[TOK_SPECIAL_EOS] = 11; /* add_bos: see tok_bpe_setup */
        break;
    case TOK_MODEL_WPM:
        id[TOK_SPECIAL_BOS] = 101, id[TOK_SPECIAL_UNK] = 100, id[TOK_SPECIAL_SEP] = 102;
        id[TOK_SPECIAL_PAD] = 0, id[TOK_SPECIAL_MASK] = 103;
        t->add_bos = true, t->add_sep = true;
        break;
    case TOK_MODEL_UGM: /* T5's; XLM-RoBERTa's files name theirs */
        id[TOK_SPECIAL_EOS] = 1, id[TOK_SPECIAL_UNK] = 2, id[TOK_SPECIAL_PAD] = 0;
        t->add_eos = true;
        break;
    }
    for (int i = 0; i < TOK_SPECIAL_COUNT; i++)
        if (id[i] >= t->n_vocab)
            id[i] = -1;
}

/* The ids the file names, over the defaults; CLS is BOS unless named. */
static int read_special_ids(tokenizer *t, const gguf_file *g, char err[ERR_MAX])
{
    int32_t *id = t->special_id;
    static const struct {
        const char *key;
        enum tok_special which;
    } keys[] = {
        {"tokenizer.ggml.cls_token_id", TOK_SPECIAL_BOS},
        {"tokenizer.ggml.bos_token_id", TOK_SPECIAL_BOS},
        {"tokenizer.ggml.eos_token_id", TOK_SPECIAL_EOS},
        {"tokenizer.ggml.eot_token_id", TOK_SPECIAL_EOT},
        {"tokenizer.ggml.eom_token_id", TOK_SPECIAL_EOM},
        {"tokenizer.ggml.unknown_token_id", TOK_SPECIAL_UNK},
        {"tokenizer.ggml.seperator_token_id", TOK_SPECIAL_SEP}, /* llama.cpp's spelling */
        {"tokenizer.ggml.separator_token_id", TOK_SPECIAL_SEP},
        {"tokenizer.ggml.padding_token_id", TOK_SPECIAL_PAD},
        {"tokenizer.ggml.mask_token_id", TOK_SPECIAL_MASK},
        {"tokenizer.ggml.fim_pre_token_id", TOK_SPECIAL_FIM_PRE},
        {"tokenizer.ggml.fim_suf_token_id", TOK_SPECIAL_FIM_SUF},
        {"tokenizer.ggml.fim_mid_token_id", TOK_SPECIAL_FIM_MID},
        {"tokenizer.ggml.fim_pad_token_id", TOK_SPECIAL_FIM_PAD},
        {"tokenizer.ggml.fim_rep_token_id", TOK_SPECIAL_FIM_REP},
        {"tokenizer.ggml.fim_sep_token_id", TOK_SPECIAL_FIM_SEP},
        /* older files' names, which llama.cpp reads after the ones above */
        {"tokenizer.ggml.prefix_token_id", TOK_SPECIAL_FIM_PRE},
        {"tokenizer.ggml.suffix_token_id", TOK_SPECIAL_FIM_SUF},
        {"tokenizer.ggml.middle_token_id", TOK_SPECIAL_FIM_MID},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (read_id(t, g, keys[i].key, &id[keys[i].which], err) < 0)
            return -1;
    id[TOK_SPECIAL_CLS] = id[TOK_SPECIAL_BOS];
    return read_id(t, g, "tokenizer.ggml.cls_token_id", &id[TOK_SPECIAL_CLS], err) < 0 ? -1 : 0;
}

/* Whether the tokenizer adds BOS, EOS, SEP and a space prefix, as the file says; refused
 * when it adds a token it lacks. */
static int read_add_flags(tokenizer *t, const gguf_file *g, char err[ERR_MAX])
{
    const int32_t *id = t->special_id;
    if (read_flag(g, "tokenizer.ggml.add_bos_token", &t->add_bos, err) ||
        read_flag(g, "tokenizer.ggml.add_eos_token", &t->add_eos, err) ||
        read_flag(g, "tokenizer.ggml.add_sep_token", &t->add_sep, err) ||
        read_flag(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err))
        return -1;
    if (t->add_bos && id[TOK_SPECIAL_BOS] < 0)
        return err_set(err, "the tokenizer adds BOS but has no BOS token");
    if (t->add_eos && id[TOK_SPECIAL_EOS] < 0)
        return err_set(err, "the tokenizer adds EOS but has no EOS token");
    if (t->model == TOK_MODEL_WPM && t->add_sep && id[TOK_SPECIAL_SEP] < 0)
        return err_set(err, "the tokenizer adds SEP but has no SEP token");
    if (t->model == TOK_MODEL_UGM && id[TOK_SPECIAL_UNK] < 0)
        return err_set(err, "the unigram tokenizer has no unknown token");
    return 0;
}

/* Fill-in-the-middle tokens no key names: the spellings llama.cpp looks for. It takes
 * a token of any type so spelled and makes it a control token; here, as in
 * mark_end_of_turn_tokens, only a control or user-defined token is taken, so that a
 * normal token that reads "<PAD>" stays text and ends nothing. */
static void find_fim_tokens(tokenizer *t)
{
    int32_t *id = t->special_id;
    static const struct {
        enum tok_special which;
        const char *text[5];
    } fim_texts[] = {
        /* DeepSeek's are split where a hex escape would swallow the letter after it */
        {TOK_SPECIAL_FIM_PRE,
         {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", /* StarCoder's, Granite's */
          "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", "<PRE>"}},
        {TOK_SPECIAL_FIM_SUF,
         {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
          "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>", "<SUF>"}},
        {TOK_SPECIAL_FIM_MID,
         {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
          "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>", "<MID>"}},
        {TOK_SPECIAL_FIM_PAD, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"}},
        {TOK_SPECIAL_FIM_REP, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>"}},
        {TOK_SPECIAL_FIM_SEP, {"<|file_sep|>"}},
    };
    for (size_t i = 0; i < sizeof fim_texts / sizeof *fim_texts; i++)
        for (size_t k = 0; id[fim_texts[i].which] < 0 && k < 5 && fim_texts[i].text[k]; k++) {
            const char *s = fim_texts[i].text[k];
            int32_t e = tok_lookup(t, s, strlen(s));
            if (e >= 0 && (t->types[e] == TOK_TYPE_CONTROL || t->types[e] == TOK_TYPE_USER_DEFINED))
                id[fim_texts[i].which] = e;
        }
}

/* Tokens that end a turn in common chat formats, as llama.cpp recognises them (at
 * most TOK_EOG_MAX with the six roles below). */
static void mark_end_of_turn_tokens(tokenizer *t)
{
    int32_t *id = t->special_id;
    static const char *eog_texts[] = {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|eom_id|>",
        "<EOT>",
        "<|end_of_text|>",
        "<|return|>",
        "<|call|>",
        "_<EOT>",
        "<|END_OF_TURN_TOKEN|>", /* Cohere's, whatever EOS its file names */
        ("<\xef\xbd\x9c" /* split: \x9c would swallow the 'e' that follows */
         "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"),
    };
    _Static_assert(sizeof eog_texts / sizeof *eog_texts + 6 <= TOK_EOG_MAX,
                   "the texts and the roles EOS, EOT, EOM, FIM_PAD, FIM_REP and FIM_SEP fit "
                   "tok_eog_tokens' list");
    for (size_t i = 0; i < sizeof eog_texts / sizeof eog_texts[0]; i++) {
        int32_t e = tok_lookup(t, eog_texts[i], strlen(eog_texts[i]));
        if (e < 0 || (t->types[e] != TOK_TYPE_CONTROL && t->types[e] != TOK_TYPE_USER_DEFINED))
            continue;
        t->flags[e] |= TOK_FLAG_EOG;
        if (id[TOK_SPECIAL_EOT] < 0 && strcmp(eog_texts[i], "<|eom_id|>") != 0)
            id[TOK_SPECIAL_EOT] = e;
        if (id[TOK_SPECIAL_EOM] < 0 && strcmp(eog_texts[i], "<|eom_id|>") == 0)
            id[TOK_SPECIAL_EOM] = e;
    }
    /* llama.cpp ends generation at FIM_PAD, FIM_REP and FIM_SEP too: a model that fills
     * a hole writes one of them when it would go on to another file */
    static const enum tok_special eog_roles[] = {TOK_SPECIAL_EOS,     TOK_SPECIAL_EOT,
                                                 TOK_SPECIAL_EOM,     TOK_SPECIAL_FIM_PAD,
                                                 TOK_SPECIAL_FIM_REP, TOK_SPECIAL_FIM_SEP};
    for (size_t i = 0; i < sizeof eog_roles / sizeof *eog_roles; i++)
        if (id[eog_roles[i]] >= 0)
            t->flags[id[eog_roles[i]]] |= TOK_FLAG_EOG;
}

/* The special tokens' ids, the tokens that end generation, and what encoding adds. */
static int load_specials(tokenizer *t, const gguf_file *g, char err[ERR_MAX])
{
    default_specials(t);
    if (read_special_ids(t, g, err) || read_add_flags(t, g, err))
        return -1;
    find_fim_tokens(t);
    mark_end_of_turn_tokens(t);
    harmony_markup(t);
    list_eog_tokens(t);
    return 0;
}

typedef struct {
    uint32_t len;
    int32_t id;
} special_key;

static int by_length_desc(const void *a, const void *b)
{
    const special_key *x = a, *y = b;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : 1;
}

static int list_specials(tokenizer *t, char err[ERR_MAX])
{
    special_key *keys = malloc((size_t)t->n_vocab * sizeof *keys);
    t->specials = malloc((size_t)t->n_vocab * sizeof *t->specials);
    if (!keys || !t->specials) {
        free(keys);
        return err_set(err, "out of memory for special tokens");
    }
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint8_t ty = t->types[id];
        if ((ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER_DEFINED || ty == TOK_TYPE_UNKNOWN) &&
            t->text_len[id] > 0)
            keys[t->n_specials++] = (special_key){t->text_len[id], id};
    }
    qsort(keys, (size_t)t->n_specials, sizeof *keys, by_length_desc);
    for (int32_t i = 0; i < t->n_specials; i++)
        t->specials[i] = keys[i].id;
    free(keys);
    return 0;
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                  : -1;
}

/* Byte value of an SPM byte token "<0xXX>", or -1. */
static int byte_value(const tokenizer *t, int32_t id)
{
    const char *s = t->text + t->text_off[id];
    if (t->text_len[id] != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>' || hex_digit(s[3]) < 0 ||
        hex_digit(s[4]) < 0)
        return -1;
    return hex_digit(s[3]) * 16 + hex_digit(s[4]);
}

static int spm_setup(tokenizer *t, char err[ERR_MAX])
{
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->types[id] == TOK_TYPE_BYTE && byte_value(t, id) < 0)
            return err_set(err, "token %d '%.32s' has type byte but is not <0xXX>", id,
                           t->text + t->text_off[id]);
    for (int b = 0; b < 256; b++) {
        char name[8], raw = (char)b;
        snprintf(name, sizeof name, "<0x%02X>", b);
        int32_t id = tok_lookup(t, name, 6);
        if (id < 0)
            id = tok_lookup(t, &raw, 1);
        t->byte_token[b] = id >= 0 ? id : t->special_id[TOK_SPECIAL_UNK];
    }
    return 0;
}

int tok_load(const gguf_file *g, tokenizer **out, char err[ERR_MAX])
{
    *out = NULL;
    gguf_str model;
    if (!gguf_get_str(g, "tokenizer.ggml.model", &model))
        return err_set(err, "tokenizer.ggml.model: missing or not a string");
    tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return err_set(err, "out of memory");
    if (gguf_str_eq(model, "llama"))
        t->model = TOK_MODEL_SPM;
    else if (gguf_str_eq(model, "gpt2"))
        t->model = TOK_MODEL_BPE;
    else if (gguf_str_eq(model, "bert"))
        t->model = TOK_MODEL_WPM;
    else if (gguf_str_eq(model, "t5"))
        t->model = TOK_MODEL_UGM;
    else {
        free(t);
        return err_set(err, "tokenizer.ggml.model '%.*s': unsupported (llama, gpt2, bert, t5)",
                       (int)(model.len > 32 ? 32 : model.len), model.ptr);
    }
    for (int b = 0; b < 256; b++)
        t->byte_token[b] = -1;

    int rc = load_tokens(t, g, err);
    if (rc == 0)
        rc = build_map(t, err);
    if (rc == 0 && t->model == TOK_MODEL_BPE)
        rc = tok_bpe_setup(t, g, err);
    if (rc == 0 && t->model == TOK_MODEL_WPM)
        rc = tok_wpm_setup(t, err);
    if (rc == 0 && t->model == TOK_MODEL_UGM)
        rc = tok_ugm_setup(t, g, err);
    if (rc == 0)
        rc = load_specials(t, g, err);
    if (rc == 0 && t->model == TOK_MODEL_SPM)
        rc = spm_setup(t, err);
    if (rc == 0)
        rc = list_specials(t, err);
    if (rc) {
        tok_free(t);
        return -1;
    }
    for (int32_t id = 0; id < t->n_vocab; id++) {
        int len = tok_piece(t, id, NULL, 0);
        if (len > 0 && (size_t)len > t->max_piece_len)
            t->max_piece_len = (size_t)len;
    }
    *out = t;
    return 0;
}

void tok_free(tokenizer *t)
{
    if (!t)
        return;
    free(t->text);
    free(t->text_off);
    free(t->text_len);
    free(t->scores);
    free(t->types);
    free(t->flags);
    free(t->map);
    free(t->merge_keys);
    free(t->merge_rank);
    free(t->merge_result);
    free(t->specials);
    free(t->charsmap);
    free(t->ugm_pieces);
    for (int i = 0; i < t->n_regex; i++)
        pcre2_code_free(t->regex[i]);
    pcre2_code_free(t->wpm_class);
    free(t);
}

/* ---- encoding ---- */

/* A run of input text (id == -1) or a special token found in it. */
typedef struct {
    size_t off, len;
    int32_t id;
} segment;

typedef struct {
    segment *v;
    size_t n, cap;
} segments;

static int seg_add(segments *s, size_t off, size_t len, int32_t id)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        segment *v = realloc(s->v, cap * sizeof *v);
        if (!v)
            return -1;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (segment){off, len, id};
    return 0;
}

/* First occurrence of needle[0..m) (m > 0) in hay[0..n), or NULL. */
static const char *find_bytes(const char *hay, size_t n, const char *needle, size_t m)
{
    for (const char *p = hay, *end = hay + n; (size_t)(end - p) >= m;) {
        p = memchr(p, needle[0], (size_t)(end - p) - m + 1);
        if (!p)
            return NULL;
        if (memcmp(p, needle, m) == 0)
            return p;
        p++;
    }
    return NULL;
}

/* Splits the text around special tokens, longest tokens first, as llama.cpp does:
 * user-defined tokens always, control and unknown ones only with parse_special. */
static int split_specials(const tokenizer *t, const char *text, size_t len, bool parse_special,
                          segments *segs)
{
    segments next = {0};
    if (len > 0 && seg_add(segs, 0, len, -1))
        return -1;
    for (int32_t k = 0; k < t->n_specials; k++) {
        int32_t id = t->specials[k];
        if (!parse_special && t->types[id] != TOK_TYPE_USER_DEFINED)
            continue;
        const char *tt = t->text + t->text_off[id];
        size_t tl = t->text_len[id];
        next.n = 0;
        for (size_t i = 0; i < segs->n; i++) {
            segment s = segs->v[i];
            if (s.id >= 0) {
                if (seg_add(&next, s.off, s.len, s.id))
                    goto fail;
                continue;
            }
            size_t pos = s.off, end = s.off + s.len;
            const char *hit;
            while (end - pos >= tl && (hit = find_bytes(text + pos, end - pos, tt, tl))) {
                size_t at = (size_t)(hit - text);
                if ((at > pos && seg_add(&next, pos, at - pos, -1)) || seg_add(&next, at, tl, id))
                    goto fail;
                pos = at + tl;
            }
            if (pos < end && seg_add(&next, pos, end - pos, -1))
                goto fail;
        }
        segments tmp = *segs;
        *segs = next;
        next = tmp;
    }
    free(next.v);
    return 0;
fail:
    free(next.v);
    return -1;
}

int tok_encode(const tokenizer *t, const char *text, size_t len, bool add_special,
               bool parse_special, int32_t *out, int max_out)
{
    if (!t || (!text && len > 0) || max_out < 0 || (!out && max_out > 0) || len > INT32_MAX / 4)
        return -1;
    tok_out o = {out, max_out, 0};
    segments segs = {0};
    if (split_specials(t, text, len, parse_special, &segs)) {
        free(segs.v);
        return -1;
    }
    if (add_special && t->add_bos)
        tok_out_push(&o, t->special_id[TOK_SPECIAL_BOS]);
    bool prev_special = true; /* SPM: a space is prefixed to text after a special token */
    for (size_t i = 0; i < segs.n; i++) {
        const segment *s = &segs.v[i];
        int rc = 0;
        if (s->id >= 0)
            tok_out_push(&o, s->id);
        else if (t->model == TOK_MODEL_SPM)
            rc = tok_spm_encode(t, text + s->off, s->len, t->add_space_prefix && prev_special, &o);
        else if (t->model == TOK_MODEL_BPE)
            rc = tok_bpe_encode(t, text + s->off, s->len, &o);
        else if (t->model == TOK_MODEL_UGM) /* each run of text is normalized alone */
            rc = tok_ugm_encode(t, text + s->off, s->len, &o);
        else
            rc = tok_wpm_encode(t, text + s->off, s->len, &o);
        if (rc) {
            free(segs.v);
            return -1;
        }
        prev_special = s->id >= 0;
    }
    free(segs.v);
    if (add_special && t->model == TOK_MODEL_WPM && t->add_sep)
        tok_out_push(&o, t->special_id[TOK_SPECIAL_SEP]);
    if (add_special && t->add_eos)
        tok_out_push(&o, t->special_id[TOK_SPECIAL_EOS]);
    return o.n;
}

/* ---- pieces and decoding ---- */

/* Output text: copies what fits (leaving room for a NUL), counts everything. */
typedef struct {
    char *buf;
    size_t cap, n;
    bool strip_space; /* drop one leading ' ' of the next bytes written */
} sink;

static void sink_put(sink *s, const char *p, size_t n)
{
    if (s->strip_space && n > 0) {
        if (p[0] == ' ')
            p++, n--;
        s->strip_space = false;
    }
    for (size_t i = 0; i < n; i++, s->n++)
        if (s->n + 1 < s->cap)
            s->buf[s->n] = p[i];
}

static void put_piece(const tokenizer *t, int32_t id, bool special, sink *s)
{
    const char *text = t->text + t->text_off[id];
    size_t len = t->text_len[id];
    switch ((enum tok_type)t->types[id]) {
    case TOK_TYPE_UNKNOWN:
    case TOK_TYPE_CONTROL:
        if (special)
            sink_put(s, text, len);
        return;
    case TOK_TYPE_USER_DEFINED:
        sink_put(s, text, len);
        return;
    case TOK_TYPE_BYTE: {
        int b = t->model != TOK_MODEL_BPE ? byte_value(t, id) : -1;
        char c = (char)b;
        if (b >= 0)
            sink_put(s, &c, 1);
        return;
    }
    case TOK_TYPE_NORMAL:
        break;
    default:
        return;
    }
    if (t->model == TOK_MODEL_BPE) {
        for (size_t i = 0; i < len;) {
            size_t used;
            uint32_t cp = tok_utf8_decode(text + i, len - i, &used);
            int b = cp < TOK_BYTE_CHARS ? t->char_byte[cp] : -1;
            if (b >= 0) {
                char c = (char)b;
                sink_put(s, &c, 1);
            } else {
                sink_put(s, text + i, used);
            }
            i += used;
        }
        return;
    }
    /* SPM, Unigram and WordPiece: '▁' stands for a space */
    size_t start = 0;
    for (size_t i = 0; i + 3 <= len; i++) {
        if (memcmp(text + i, "\xe2\x96\x81", 3) == 0) {
            sink_put(s, text + start, i - start);
            sink_put(s, " ", 1);
            start = i + 3;
            i += 2;
        }
    }
    sink_put(s, text + start, len - start);
}

static int sink_end(sink *s)
{
    if (s->cap > 0)
        s->buf[s->n < s->cap ? s->n : s->cap - 1] = 0;
    return s->n > INT32_MAX ? -1 : (int)s->n;
}

int tok_piece(const tokenizer *t, int32_t id, char *buf, size_t cap)
{
    if (!t || id < 0 || id >= t->n_vocab || (!buf && cap > 0))
        return -1;
    sink s = {buf, cap, 0, false};
    put_piece(t, id, true, &s);
    return sink_end(&s);
}

size_t tok_max_piece_len(const tokenizer *t)
{
    return t->max_piece_len;
}

/* Whether a token stands for bytes of a reply (tok_pieces). */
static bool has_text(const tokenizer *t, int32_t id)
{
    enum tok_type type = tok_type(t, id);
    return (type == TOK_TYPE_NORMAL || type == TOK_TYPE_BYTE || type == TOK_TYPE_USER_DEFINED) &&
           !tok_is_eog(t, id);
}

int tok_pieces_new(const tokenizer *t, tok_pieces *out, char err[ERR_MAX])
{
    int32_t n = t->n_vocab;
    memset(out, 0, sizeof *out);
    if (!(out->start = malloc(sizeof *out->start * ((size_t)n + 1))))
        return err_set(err, "tokenizer: out of memory for a vocabulary of %d tokens", (int)n);
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        out->start[i] = (uint32_t)total;
        int len = has_text(t, i) ? tok_piece(t, i, NULL, 0) : 0;
        total += len > 0 ? (size_t)len : 0;
        if (total > UINT32_MAX) {
            tok_pieces_free(out);
            return err_set(err, "tokenizer: the vocabulary's pieces pass 4 GiB");
        }
    }
    out->start[n] = (uint32_t)total;
    /* tok_piece writes a NUL after the piece: one byte more at the end */
    if (!(out->bytes = malloc(total + 1))) {
        tok_pieces_free(out);
        return err_set(err, "tokenizer: out of memory for %zu bytes of pieces", total);
    }
    out->bytes[total] = 0;
    for (int32_t i = 0; i < n; i++) {
        uint32_t len = out->start[i + 1] - out->start[i];
        if (len)
            tok_piece(t, i, (char *)out->bytes + out->start[i], (size_t)len + 1);
    }
    out->n_vocab = n;
    return 0;
}

void tok_pieces_free(tok_pieces *p)
{
    free(p->start);
    free(p->bytes);
    memset(p, 0, sizeof *p);
}

int tok_decode(const tokenizer *t, const int32_t *ids, int n, bool remove_special,
               bool unparse_special, char *buf, size_t cap)
{
    if (!t || n < 0 || (!ids && n > 0) || (!buf && cap > 0))
        return -1;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return -1;
    if (remove_special && t->add_bos && n > 0 && ids[0] == t->special_id[TOK_SPECIAL_BOS])
        ids++, n--;
    if (remove_special && t->add_eos && n > 0 && ids[n - 1] == t->special_id[TOK_SPECIAL_EOS])
        n--;
    sink s = {buf, cap, 0, false};
    bool after_special = true;
    for (int i = 0; i < n; i++) {
        /* Undo the encoder's space prefix: SPM prefixes a space to the start of the text
         * and to text after a special token; WordPiece starts every word with one. */
        if (t->model == TOK_MODEL_SPM || t->model == TOK_MODEL_UGM)
            s.strip_space = t->add_space_prefix && after_special;
        else if (t->model == TOK_MODEL_WPM && s.n == 0)
            s.strip_space = true;
        put_piece(t, ids[i], unparse_special, &s);
        uint8_t ty = t->types[ids[i]];
        after_special =
            ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_UNKNOWN || ty == TOK_TYPE_USER_DEFINED;
    }
    return sink_end(&s);
}

/* ---- accessors ---- */

enum tok_model tok_model(const tokenizer *t)
{
    return t->model;
}

int32_t tok_n_vocab(const tokenizer *t)
{
    return t->n_vocab;
}

int32_t tok_special(const tokenizer *t, enum tok_special which)
{
    return (unsigned)which < TOK_SPECIAL_COUNT ? t->special_id[which] : -1;
}

int32_t tok_bos(const tokenizer *t)
{
    return t->special_id[TOK_SPECIAL_BOS];
}

int32_t tok_eos(const tokenizer *t)
{
    return t->special_id[TOK_SPECIAL_EOS];
}

bool tok_add_bos(const tokenizer *t)
{
    return t->add_bos;
}

bool tok_add_eos(const tokenizer *t)
{
    return t->add_eos;
}

bool tok_is_eog(const tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && (t->flags[id] & TOK_FLAG_EOG);
}

int tok_eog_tokens(const tokenizer *t, const int32_t **ids)
{
    *ids = t->eog;
    return t->n_eog;
}

enum tok_type tok_type(const tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab ? (enum tok_type)t->types[id] : TOK_TYPE_INVALID;
}

const char *tok_token_text(const tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_vocab)
        return NULL;
    if (len)
        *len = t->text_len[id];
    return t->text + t->text_off[id];
}

int32_t tok_find(const tokenizer *t, const char *text, size_t len)
{
    return text || len == 0 ? tok_lookup(t, text ? text : "", len) : -1;
}

/* ---- the merge queue of SPM and BPE (a binary heap) ---- */

static bool pair_before(const tok_pair *a, const tok_pair *b)
{
    return a->priority > b->priority || (a->priority == b->priority && a->left < b->left);
}

int tok_merge_queue_push(tok_merge_queue *q, tok_pair p)
{
    if (q->n == q->cap) {
        size_t cap = q->cap ? q->cap * 2 : 64;
        tok_pair *v = realloc(q->v, cap * sizeof *v);
        if (!v)
            return -1;
        q->v = v;
        q->cap = cap;
    }
    size_t i = q->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!pair_before(&p, &q->v[parent]))
            break;
        q->v[i] = q->v[parent];
        i = parent;
    }
    q->v[i] = p;
    return 0;
}

tok_pair tok_merge_queue_pop(tok_merge_queue *q)
{
    tok_pair top = q->v[0], last = q->v[--q->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= q->n)
            break;
        if (c + 1 < q->n && pair_before(&q->v[c + 1], &q->v[c]))
            c++;
        if (!pair_before(&q->v[c], &last))
            break;
        q->v[i] = q->v[c];
        i = c;
    }
    if (q->n > 0)
        q->v[i] = last;
    return top;
}
