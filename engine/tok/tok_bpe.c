/*
 * tok_bpe.c — byte-level BPE encoding ("gpt2" vocabularies).
 *
 * Text is split by the pre-tokenizer regexes that tokenizer.ggml.pre names (the lists
 * llama.cpp uses for each model family); each regex re-splits every fragment the
 * previous one produced, keeping both matches and the text between them. Each
 * fragment's bytes become GPT-2 byte-level characters, which are merged pairwise by
 * lowest merge rank (ties: leftmost) as in llama.cpp.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/tok/tok_internal.h"
#include "engine/tok/utf8.h"

/* White space as llama.cpp's tables (Unicode's White_Space property) have it: RE_WS goes
 * inside a class, RE_S stands for \s and RE_NS for \S. PCRE2's \s would also match
 * U+180E MONGOLIAN VOWEL SEPARATOR (white space before Unicode 6.3, still in PCRE2's
 * horizontal space list), splitting " \u180e!" after the space where llama.cpp keeps
 * it one piece. */
#define RE_WS                                                                             \
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}" \
    "\\x{205F}\\x{3000}"
#define RE_S "[" RE_WS "]"
#define RE_NS "[^" RE_WS "]"
#define RE_GPT2                                                               \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" RE_WS "\\p{L}\\p{N}]+" \
    "|" RE_S "+(?!" RE_NS ")"
#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_LLAMA3                                                \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}" \
    "| ?[^" RE_WS "\\p{L}\\p{N}]+[\\r\\n]*|" RE_S "*[\\r\\n]+|" RE_S "+(?!" RE_NS ")|" RE_S "+"
#define RE_QWEN2                                            \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}" \
    "| ?[^" RE_WS "\\p{L}\\p{N}]+[\\r\\n]*|" RE_S "*[\\r\\n]+|" RE_S "+(?!" RE_NS ")|" RE_S "+"
/* Seed-Coder's and Seed-OSS's: qwen2's, punctuation without the line breaks after it */
#define RE_SEED_CODER                                        \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}" \
    "| ?[^" RE_WS "\\p{L}\\p{N}]+|" RE_S "*[\\r\\n]+|" RE_S "+(?!" RE_NS ")|" RE_S "+"
/* Hunyuan's dense models', DeepSeek-V3's and JoyAI-LLM's: digits in threes, runs of CJK
 * ideographs and kana, then words (a letter run may start with one ASCII punctuation
 * mark), punctuation and symbols */
#define RE_HUNYUAN_KANJI_KANA "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+"
#define RE_HUNYUAN_WORDS                                                     \
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"                        \
    "|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*" \
    "|" RE_S "*[\\r\\n]+|" RE_S "+(?!" RE_NS ")|" RE_S "+"
#define RE_CJK "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
/* A run of letters other than a-z, then of letters other than A-Z (or the reverse).
 * llama.cpp writes "a letter other than a-z" as ((?=[\p{L}])([^a-z])); a repeated group
 * costs PCRE2 a backtracking frame per letter, so a word of some 850 letters ran out of
 * JIT stack and the encode failed. The single class [^\P{L}a-z] matches the same. */
#define RE_UPPER_LOWER(suffix)                                \
    "[^\\r\\n\\p{L}\\p{N}]?[^\\P{L}a-z]*[^\\P{L}A-Z]+" suffix \
    "|[^\\r\\n\\p{L}\\p{N}]?[^\\P{L}a-z]+[^\\P{L}A-Z]*" suffix
/* Cased letters, as DeepSeek's tokenizer lists them. */
#define RE_DEEPSEEK_LETTERS                                                                \
    "A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"         \
    "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}" \
    "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-" \
    "\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}"     \
    "\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}"         \
    "\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"         \
    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}" \
    "\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-"         \
    "\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-"         \
    "\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}" \
    "\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-" \
    "\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}"  \
    "\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}"          \
    "\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}"         \
    "\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}"         \
    "\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"     \
    "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}" \
    "\\x{1E900}-\\x{1E943}"

typedef struct {
    const char *names[8];
    const char *regex[TOK_MAX_REGEX];
    bool ignore_merges; /* a fragment that is a whole token is not merged up from bytes */
    bool add_bos;       /* the default for tokenizer.ggml.add_bos_token */
} pre_tokenizer;

static const pre_tokenizer pre_tokenizers[] = {
    {{"default"},
     {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"},
     false,
     false},
    {{"gpt-2", "phi-2", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "mpt", "olmo"},
     {RE_GPT2},
     false,
     false},
    {{"gpt-neox"}, {RE_GPT2}, false, false},
    {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral"},
     {RE_LLAMA3},
     true,
     true},
    {{"dbrx", "smaug-bpe"}, {RE_LLAMA3}, false, false},
    /* GLM-4 (chatglm-bpe: GLM-4-9B-chat; glm4: GLM-4-0414, GLM-Z1): no BOS, its prompt opens
     * with the template's "[gMASK]<sop>" */
    {{"glm4", "chatglm-bpe"}, {RE_LLAMA3}, false, false},
    {{"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"}, {RE_QWEN2}, false, false},
    {{"seed-coder"}, {RE_SEED_CODER}, false, false},
    /* deepseek-v3: DeepSeek-V3 and R1; joyai-llm: JoyAI-LLM-Flash */
    {{"hunyuan-dense", "deepseek-v3", "joyai-llm"},
     {"\\p{N}{1,3}", RE_HUNYUAN_KANJI_KANA, RE_HUNYUAN_WORDS},
     false,
     false},
    {{"deepseek-llm"},
     {"[\r\n]", RE_S "?[" RE_DEEPSEEK_LETTERS "]+",
      RE_S "?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
      RE_S "+$", RE_CJK, "\\p{N}+"},
     false,
     false},
    {{"deepseek-coder"},
     {"[\r\n]", RE_S "?\\p{L}+", RE_S "?\\p{P}+", RE_CJK, "\\p{N}"},
     false,
     false},
    {{"falcon"}, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}, false, false},
    {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
     {"\\p{N}", RE_GPT2},
     false,
     false},
    {{"poro-chat", "bloom", "gpt3-finnish"},
     {" ?[^(" RE_WS "|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{0964}\\x{06D4}\\x{060C})]+"},
     false,
     false},
    {{"viking"},
     {" ?[^(" RE_WS "|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{0964}\\x{06D4}\\x{060C})]+",
      "\\p{N}"},
     false,
     false},
    {{"tekken"},
     {RE_UPPER_LOWER("") "|\\p{N}| ?[^" RE_WS "\\p{L}\\p{N}]+[\\r\\n/]*"
                         "|" RE_S "*[\\r\\n]+|" RE_S "+(?!" RE_NS ")"},
     true,
     true},
    {{"gpt-4o"},
     {RE_UPPER_LOWER(RE_CONTRACTIONS "?") "|\\p{N}{1,3}| ?[^" RE_WS "\\p{L}\\p{N}]+[\\r\\n/]*"
                                          "|" RE_S "*[\\r\\n]+|" RE_S "+(?!" RE_NS ")|" RE_S "+"},
     false,
     false},
};

/* ---- merges: (left, right) -> rank, result ---- */

static uint32_t pair_hash(uint64_t key)
{
    key *= 0x9E3779B97F4A7C15ull;
    return (uint32_t)(key >> 32);
}

/* Merge rank of two adjacent tokens (-1 if they do not merge); *result gets the merged
 * token. */
static int32_t merge_rank(const tokenizer *t, int32_t left, int32_t right, int32_t *result)
{
    if (!t->merge_keys || left < 0 || right < 0)
        return -1;
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    for (uint32_t i = pair_hash(key) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        if (t->merge_keys[i] == UINT64_MAX)
            return -1;
        if (t->merge_keys[i] == key) {
            *result = t->merge_result[i];
            return t->merge_rank[i];
        }
    }
}

static int load_merges(tokenizer *t, const gguf_file *g, char err[ERR_MAX])
{
    static const char *key = "tokenizer.ggml.merges";
    enum gguf_value_type et;
    uint64_t n;
    if (!gguf_get_arr(g, key, &et, &n) || et != GGUF_STRING)
        return err_set(err, "%s: missing or not a string array (needed by gpt2 tokenizers)", key);
    if (n > INT32_MAX / 4)
        return err_set(err, "%s: too many merges (%llu)", key, (unsigned long long)n);
    uint32_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    t->merge_keys = malloc(cap * sizeof *t->merge_keys);
    t->merge_rank = malloc(cap * sizeof *t->merge_rank);
    t->merge_result = malloc(cap * sizeof *t->merge_result);
    char *buf = malloc(t->max_token_len * 2 + 2);
    if (!t->merge_keys || !t->merge_rank || !t->merge_result || !buf) {
        free(buf);
        return err_set(err, "out of memory for %llu merges", (unsigned long long)n);
    }
    memset(t->merge_keys, 0xff, cap * sizeof *t->merge_keys);
    t->merge_mask = cap - 1;

    for (uint64_t r = 0; r < n; r++) {
        gguf_str s;
        if (!gguf_arr_str(g, key, r, &s)) {
            free(buf);
            return err_set(err, "%s[%llu]: unreadable", key, (unsigned long long)r);
        }
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
        if (!sp) {
            free(buf);
            return err_set(err, "%s[%llu]: '%.*s' is not two tokens separated by a space", key,
                           (unsigned long long)r, (int)(s.len > 64 ? 64 : s.len), s.ptr);
        }
        size_t la = (size_t)(sp - s.ptr), lb = s.len - la - 1;
        int32_t a = tok_lookup(t, s.ptr, la), b = tok_lookup(t, sp + 1, lb), m = -1;
        if (a >= 0 && b >= 0 && la + lb <= t->max_token_len) {
            memcpy(buf, s.ptr, la);
            memcpy(buf + la, sp + 1, lb);
            m = tok_lookup(t, buf, la + lb);
        }
        if (a < 0 || b < 0 || m < 0) {
            free(buf);
            return err_set(err, "%s[%llu]: '%.*s' names a token that is not in the vocabulary", key,
                           (unsigned long long)r, (int)(s.len > 64 ? 64 : s.len), s.ptr);
        }
        uint64_t pk = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
        uint32_t i = pair_hash(pk) & t->merge_mask;
        while (t->merge_keys[i] != UINT64_MAX && t->merge_keys[i] != pk)
            i = (i + 1) & t->merge_mask;
        if (t->merge_keys[i] == pk)
            continue; /* a repeated merge keeps its first (best) rank */
        t->merge_keys[i] = pk;
        t->merge_rank[i] = (int32_t)r;
        t->merge_result[i] = m;
    }
    free(buf);
    return 0;
}

int tok_bpe_setup(tokenizer *t, const gguf_file *g, char err[ERR_MAX])
{
    gguf_str pre = {"default", 7};
    if (gguf_find_key(g, "tokenizer.ggml.pre") >= 0 && !gguf_get_str(g, "tokenizer.ggml.pre", &pre))
        return err_set(err, "tokenizer.ggml.pre: not a string");

    const pre_tokenizer *p = NULL;
    for (size_t i = 0; !p && i < sizeof pre_tokenizers / sizeof pre_tokenizers[0]; i++)
        for (int j = 0; j < 8 && pre_tokenizers[i].names[j]; j++)
            if (pre.len == strlen(pre_tokenizers[i].names[j]) &&
                memcmp(pre.ptr, pre_tokenizers[i].names[j], pre.len) == 0)
                p = &pre_tokenizers[i];
    if (!p)
        return err_set(err, "unknown pre-tokenizer type '%.*s' (tokenizer.ggml.pre)",
                       (int)(pre.len > 64 ? 64 : pre.len), pre.ptr);
    t->ignore_merges = p->ignore_merges;
    t->add_bos = p->add_bos;

    for (int i = 0; i < TOK_MAX_REGEX && p->regex[i]; i++) {
        int code;
        PCRE2_SIZE at;
        t->regex[i] =
            pcre2_compile((PCRE2_SPTR)p->regex[i], PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY,
                          &code, &at, NULL);
        if (!t->regex[i]) {
            PCRE2_UCHAR msg[120];
            pcre2_get_error_message(code, msg, sizeof msg);
            return err_set(err, "pre-tokenizer regex %d: %s at offset %zu", i, (char *)msg,
                           (size_t)at);
        }
        t->n_regex = i + 1;
        pcre2_jit_compile(t->regex[i], PCRE2_JIT_COMPLETE); /* optional speed-up */
    }

    /* GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves, the
     * others take code points from 256 upwards in byte order. */
    int next = 256;
    memset(t->char_byte, 0xff, sizeof t->char_byte);
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        t->byte_char[b] = (uint16_t)(printable ? b : next++);
        t->char_byte[t->byte_char[b]] = (int16_t)b;
        char u[4];
        t->byte_token[b] = tok_lookup(t, u, utf8_encode(t->byte_char[b], u));
    }
    return load_merges(t, g, err);
}

/* ---- pre-tokenization ---- */

typedef struct {
    size_t off, len;
} frag;

typedef struct {
    frag *v;
    size_t n, cap;
} frag_list;

static int frag_add(frag_list *l, size_t off, size_t len)
{
    if (len == 0)
        return 0;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        frag *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return -1;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (frag){off, len};
    return 0;
}

/* Splits every fragment of in by re into out: matches and the gaps between them. */
static int split(const pcre2_code *re, pcre2_match_data *md, const char *text, const frag_list *in,
                 frag_list *out)
{
    out->n = 0;
    for (size_t f = 0; f < in->n; f++) {
        PCRE2_SPTR subj = (PCRE2_SPTR)text + in->v[f].off;
        size_t len = in->v[f].len, start = 0, done = 0;
        while (start <= len) {
            int rc = pcre2_match(re, subj, len, start, 0, md, NULL);
            if (rc == PCRE2_ERROR_NOMATCH)
                break;
            if (rc < 0)
                return -1;
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t ms = ov[0], me = ov[1];
            if (frag_add(out, in->v[f].off + done, ms - done) ||
                frag_add(out, in->v[f].off + ms, me - ms))
                return -1;
            done = me;
            start = me > ms ? me : me + (me < len ? tok_utf8_len(subj[me]) : 1);
        }
        if (frag_add(out, in->v[f].off + done, len - done))
            return -1;
    }
    return 0;
}

/* ---- merging ---- */

typedef struct {
    int32_t prev, next, id;
    uint32_t off, n; /* bytes of the fragment; n == 0 once merged away */
} bpe_sym;

static int try_pair(const tokenizer *t, const bpe_sym *syms, tok_merge_queue *h, int32_t left,
                    int32_t right)
{
    if (left < 0 || right < 0)
        return 0;
    int32_t merged;
    int32_t rank = merge_rank(t, syms[left].id, syms[right].id, &merged);
    if (rank < 0)
        return 0;
    return tok_merge_queue_push(h, (tok_pair){-(float)rank, left, right,
                                           syms[left].n + syms[right].n});
}

typedef struct {
    bpe_sym *syms;
    tok_merge_queue heap;
    char *mapped;
} bpe_scratch;

static int encode_word(const tokenizer *t, const unsigned char *w, size_t len, bpe_scratch *s,
                       tok_out *o)
{
    if (t->ignore_merges) {
        size_t n = 0;
        for (size_t i = 0; i < len; i++)
            n += utf8_encode(t->byte_char[w[i]], s->mapped + n);
        int32_t id = tok_lookup(t, s->mapped, n);
        if (id >= 0) {
            tok_out_push(o, id);
            return 0;
        }
    }

    bpe_sym *syms = s->syms;
    for (size_t i = 0; i < len; i++)
        syms[i] = (bpe_sym){(int32_t)i - 1, i + 1 == len ? -1 : (int32_t)i + 1, t->byte_token[w[i]],
                            (uint32_t)i, 1};
    s->heap.n = 0;
    for (size_t i = 1; i < len; i++)
        if (try_pair(t, syms, &s->heap, (int32_t)i - 1, (int32_t)i))
            return -1;

    while (s->heap.n > 0) {
        tok_pair p = tok_merge_queue_pop(&s->heap);
        bpe_sym *l = &syms[p.left], *r = &syms[p.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size)
            continue;
        merge_rank(t, l->id, r->id, &l->id);
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            syms[r->next].prev = p.left;
        if (try_pair(t, syms, &s->heap, l->prev, p.left) ||
            try_pair(t, syms, &s->heap, p.left, l->next))
            return -1;
    }

    for (int32_t i = len > 0 ? 0 : -1; i >= 0; i = syms[i].next) {
        if (syms[i].id >= 0) {
            tok_out_push(o, syms[i].id);
            continue;
        }
        /* A byte whose character is not in the vocabulary: llama.cpp tries each byte
         * of the character's UTF-8 as a token of its own. */
        char u[4];
        size_t n = utf8_encode(t->byte_char[w[syms[i].off]], u);
        for (size_t j = 0; j < n; j++) {
            int32_t id = tok_lookup(t, u + j, 1);
            if (id >= 0)
                tok_out_push(o, id);
        }
    }
    return 0;
}

int tok_bpe_encode(const tokenizer *t, const char *text, size_t len, tok_out *o)
{
    frag_list a = {0}, b = {0};
    pcre2_match_data *md[TOK_MAX_REGEX] = {0};
    bpe_scratch s = {malloc(len * sizeof *s.syms + 1), {0}, malloc(len * 2 + 1)};
    int rc = -1;
    if (!s.syms || !s.mapped || frag_add(&a, 0, len))
        goto done;
    for (int i = 0; i < t->n_regex; i++) {
        md[i] = pcre2_match_data_create_from_pattern(t->regex[i], NULL);
        if (!md[i] || split(t->regex[i], md[i], text, &a, &b))
            goto done;
        frag_list tmp = a;
        a = b;
        b = tmp;
    }
    for (size_t f = 0; f < a.n; f++)
        if (encode_word(t, (const unsigned char *)text + a.v[f].off, a.v[f].len, &s, o))
            goto done;
    rc = 0;
done:
    for (int i = 0; i < TOK_MAX_REGEX; i++)
        pcre2_match_data_free(md[i]);
    free(a.v);
    free(b.v);
    free(s.syms);
    free(s.heap.v);
    free(s.mapped);
    return rc;
}
