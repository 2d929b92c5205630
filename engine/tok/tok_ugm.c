/*
 * tok_ugm.c — SentencePiece's Unigram model ("t5" vocabularies: T5, XLM-RoBERTa and the
 * models built on it, bge-m3, bge-reranker-v2-m3, multilingual-e5).
 *
 * The text is first normalized: the longest prefix that the file's precompiled charsmap
 * names is replaced by its string (NFKC folding, whitespace and control characters), a
 * byte that starts no valid UTF-8 character becomes U+FFFD, runs of spaces shrink to one
 * and the ends lose theirs (remove_extra_whitespaces), a space is put in front
 * (add_space_prefix), and spaces become '▁'. The normalized text is then cut into the
 * pieces whose scores (log probabilities) have the largest sum, by Viterbi over UTF-8
 * positions: a character that no piece covers is the unknown token at the lowest piece
 * score minus 10, and a run of unknowns is one unknown (or its bytes' <0xXX> tokens
 * where the vocabulary has all 256).
 *
 * This gives llama.cpp's ids, which are those of Hugging Face's fast tokenizer. They
 * differ from SentencePiece's C++ encoder in three places, which tests/engine/data's
 * make_ugm_vocab.py shows: scores add up in double (SentencePiece's float sums break
 * ties between equal segmentations another way), user-defined tokens are split from
 * the text before normalizing, each run between them getting its own space prefix, and
 * unused pieces may be chosen.
 *
 * Pieces are found by binary search in the vocabulary sorted by text, narrowing the
 * range by one byte per step, so that no trie needs building at load.
 */
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf/gguf.h"
#include "engine/tok/tok_internal.h"
#include "engine/tok/utf8.h"

#define UGM_UNKNOWN_PENALTY 10.0
/* The longest replacement a charsmap may hold: NFKC's longest is 33 bytes (U+FDFA); the
 * bound keeps a text's normalized form within a small multiple of its length. */
#define UGM_MAX_REPLACEMENT 1024

/* Growing byte buffer of the normalized text. */
typedef struct {
    char *p;
    size_t n, cap;
} ugm_buf;

static int buf_put(ugm_buf *b, const char *s, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap * 2 > b->n + n ? b->cap * 2 : b->n + n + 64;
        char *p = realloc(b->p, cap);
        if (!p)
            return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

/* ---- loading ---- */

static int by_text(const void *a, const void *b, void *owner)
{
    const tokenizer *t = owner;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t nx = t->text_len[x], ny = t->text_len[y];
    int c = memcmp(t->text + t->text_off[x], t->text + t->text_off[y], nx < ny ? nx : ny);
    if (c || nx != ny)
        return c ? c : nx < ny ? -1 : 1;
    return x > y ? -1 : 1; /* a repeated text: the later token first, as the map keeps it */
}

/* The charsmap: a uint32 size, that many bytes of XOR-compressed double array (units of
 * 32 bits), then NUL-terminated replacement strings. Checked here so that encoding only
 * has to bound its indices. */
static int load_charsmap(tokenizer *t, const gguf_file *g, char err[ERR_MAX])
{
    static const char *key = "tokenizer.ggml.precompiled_charsmap";
    if (gguf_find_key(g, key) < 0)
        return 0;
    const uint8_t *data;
    uint64_t n;
    if (!gguf_arr_bytes(g, key, &data, &n))
        return err_set(err, "%s: not an array of bytes", key);
    uint32_t units = 0;
    if (n >= 4)
        memcpy(&units, data, 4);
    if (n < 4 || units % 4 || units < 4 || (uint64_t)units + 4 >= n)
        return err_set(err, "%s: %llu bytes do not hold a %u-byte double array and strings", key,
                       (unsigned long long)n, units);
    if (data[n - 1] != 0)
        return err_set(err, "%s: the replacement strings do not end with a NUL", key);
    for (const uint8_t *s = data + 4 + units, *end = data + n; s < end;) {
        size_t len = strlen((const char *)s);
        if (len > UGM_MAX_REPLACEMENT)
            return err_set(err, "%s: a replacement string of %zu bytes (at most %d)", key, len,
                           UGM_MAX_REPLACEMENT);
        s += len + 1;
    }
    t->charsmap = malloc((size_t)n);
    if (!t->charsmap)
        return err_set(err, "out of memory for the charsmap (%llu bytes)", (unsigned long long)n);
    memcpy(t->charsmap, data, (size_t)n);
    t->charsmap_len = (size_t)n;
    return 0;
}

int tok_ugm_setup(tokenizer *t, const gguf_file *g, char err[ERR_MAX])
{
    if (load_charsmap(t, g, err) < 0)
        return -1;
    if (gguf_find_key(g, "tokenizer.ggml.remove_extra_whitespaces") >= 0 &&
        !gguf_get_bool(g, "tokenizer.ggml.remove_extra_whitespaces", &t->remove_extra_whitespaces))
        return err_set(err, "tokenizer.ggml.remove_extra_whitespaces: not a boolean");

    t->ugm_pieces = malloc((size_t)t->n_vocab * sizeof *t->ugm_pieces);
    if (!t->ugm_pieces)
        return err_set(err, "out of memory for %d pieces", (int)t->n_vocab);
    double min_score = DBL_MAX;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint8_t ty = t->types[id];
        if (ty == TOK_TYPE_NORMAL && t->scores[id] < min_score)
            min_score = t->scores[id];
        if ((ty == TOK_TYPE_NORMAL || ty == TOK_TYPE_USER_DEFINED || ty == TOK_TYPE_UNUSED) &&
            t->text_len[id] > 0)
            t->ugm_pieces[t->n_ugm_pieces++] = id;
    }
    t->ugm_unknown_score = (min_score == DBL_MAX ? 0.0 : min_score) - UGM_UNKNOWN_PENALTY;
    qsort_r(t->ugm_pieces, (size_t)t->n_ugm_pieces, sizeof *t->ugm_pieces, by_text, t);

    /* byte fallback where every byte has its <0xXX> token, as SentencePiece's trainer
     * makes them with byte_fallback */
    t->ugm_byte_fallback = true;
    for (int c = 0; c < 256; c++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", c);
        int32_t id = tok_lookup(t, name, 6);
        t->byte_token[c] = id;
        if (id < 0 || t->types[id] != TOK_TYPE_BYTE)
            t->ugm_byte_fallback = false;
    }
    return 0;
}

/* ---- normalization ---- */

static uint32_t unit_at(const tokenizer *t, uint32_t i)
{
    uint32_t u;
    memcpy(&u, t->charsmap + 4 + (size_t)i * 4, 4);
    return u;
}

/* Length of the longest prefix of s[0..n) that the charsmap replaces, and its string;
 * 0 when none. The units are darts-clone's: label in bits 0-7 (bit 31 set on value
 * units so that no byte matches them), leaf flag in bit 8, offset in bits 10-30 shifted
 * by 8 where bit 9 says so. */
static size_t charsmap_match(const tokenizer *t, const char *s, size_t n, const char **repl)
{
    if (!t->charsmap)
        return 0;
    uint32_t n_units, blob;
    memcpy(&blob, t->charsmap, 4);
    n_units = blob / 4;
    const char *strings = (const char *)t->charsmap + 4 + blob;
    size_t n_strings = t->charsmap_len - 4 - blob, best = 0;
    uint32_t u = unit_at(t, 0);
    uint32_t node = (u >> 10) << ((u & (1u << 9)) >> 6);
    for (size_t i = 0; i < n && s[i]; i++) {
        unsigned char c = (unsigned char)s[i];
        node ^= c;
        if (node >= n_units)
            break;
        u = unit_at(t, node);
        if ((u & ((1u << 31) | 0xff)) != c)
            break;
        bool leaf = (u >> 8) & 1;
        node ^= (u >> 10) << ((u & (1u << 9)) >> 6);
        if (leaf) {
            if (node >= n_units)
                break;
            uint32_t off = unit_at(t, node) & ((1u << 31) - 1);
            if (off < n_strings) { /* the strings end with a NUL (load_charsmap) */
                best = i + 1;
                *repl = strings + off;
            }
        }
    }
    return best;
}

/* One step of SentencePiece's NormalizePrefix: the normalized form of the text's first
 * characters and how many bytes it consumed. */
static size_t normalize_prefix(const tokenizer *t, const char *s, size_t n, const char **out,
                               size_t *out_len)
{
    const char *repl;
    size_t m = charsmap_match(t, s, n, &repl);
    if (m > 0) {
        *out = repl;
        *out_len = strlen(repl);
        return m;
    }
    /* utf8_seq refuses overlong forms, surrogates and code points past U+10FFFF, as
     * SentencePiece does */
    int len = utf8_seq(s, n);
    if (len <= 0) {
        *out = "\xef\xbf\xbd";
        *out_len = 3;
        return 1;
    }
    *out = s;
    *out_len = (size_t)len;
    return (size_t)len;
}

/* llama.cpp's form of SentencePiece's whitespace rules: with remove_extra_whitespaces
 * every run of spaces becomes one '▁' before the next word (none at the ends), else each
 * space is one; add_space_prefix puts one before the first word. */
static int normalize(const tokenizer *t, const char *text, size_t len, ugm_buf *b)
{
    static const char space[3] = {'\xe2', '\x96', '\x81'};
    bool merge = t->remove_extra_whitespaces, prefixed = false, in_word = false;
    for (size_t used; len > 0; text += used, len -= used) {
        const char *p;
        size_t pn;
        used = normalize_prefix(t, text, len, &p, &pn);
        for (size_t i = 0; i < pn; i++) {
            if (p[i] == ' ') {
                in_word = false;
                if (!merge && buf_put(b, space, 3))
                    return -1;
                continue;
            }
            if (!in_word) {
                in_word = true;
                if ((t->add_space_prefix && !prefixed) || merge) {
                    if (buf_put(b, space, 3))
                        return -1;
                    prefixed = true;
                }
            }
            if (buf_put(b, p + i, 1))
                return -1;
        }
    }
    return 0;
}

/* ---- segmentation ---- */

/* The best segmentation of the normalized text up to a position. */
typedef struct {
    double score; /* sum of the piece scores */
    int32_t id;   /* the last piece; -1 for the unknown token */
    uint32_t start;
} ugm_best;

/* The ids sorted at [lo, hi) whose text has byte c at depth d; all have length > d. */
static void narrow(const tokenizer *t, int32_t *lo, int32_t *hi, size_t d, unsigned char c)
{
    int32_t a = *lo, b = *hi;
    while (a < b) {
        int32_t mid = a + (b - a) / 2, id = t->ugm_pieces[mid];
        if ((unsigned char)t->text[t->text_off[id] + d] < c)
            a = mid + 1;
        else
            b = mid;
    }
    int32_t first = a;
    b = *hi;
    while (a < b) {
        int32_t mid = a + (b - a) / 2, id = t->ugm_pieces[mid];
        if ((unsigned char)t->text[t->text_off[id] + d] <= c)
            a = mid + 1;
        else
            b = mid;
    }
    *lo = first;
    *hi = a;
}

/* Offers every piece that starts at byte pos of s[0..n) to the ends it reaches; returns
 * whether one covers exactly the first character (mblen bytes). */
static bool offer_pieces(const tokenizer *t, const char *s, size_t n, size_t pos, size_t mblen,
                         ugm_best *best)
{
    bool whole_char = false;
    double base = best[pos].score;
    int32_t lo = 0, hi = t->n_ugm_pieces;
    for (size_t d = 0; pos + d < n; d++) {
        /* pieces of length d equal the prefix matched so far and sort first */
        while (lo < hi && t->text_len[t->ugm_pieces[lo]] == d)
            lo++;
        narrow(t, &lo, &hi, d, (unsigned char)s[pos + d]);
        if (lo == hi)
            break;
        int32_t id = t->ugm_pieces[lo];
        if (t->text_len[id] != d + 1)
            continue;
        /* user-defined pieces score 0, above every log probability, as llama.cpp has it */
        double score = base + (t->types[id] == TOK_TYPE_USER_DEFINED ? 0.0 : t->scores[id]);
        ugm_best *end = &best[pos + d + 1];
        if (score > end->score)
            *end = (ugm_best){score, id, (uint32_t)pos};
        if (d + 1 == mblen)
            whole_char = true;
    }
    return whole_char;
}

/* Emits the unknown text s[0..n): the unknown token, or with byte fallback its bytes. */
static void put_unknown(const tokenizer *t, const char *s, size_t n, tok_out *o)
{
    if (!t->ugm_byte_fallback) {
        tok_out_push(o, t->special_id[TOK_SPECIAL_UNK]);
        return;
    }
    for (size_t i = 0; i < n; i++)
        tok_out_push(o, t->byte_token[(unsigned char)s[i]]);
}

int tok_ugm_encode(const tokenizer *t, const char *text, size_t len, tok_out *o)
{
    ugm_buf b = {0};
    ugm_best *best = NULL;
    uint32_t *path = NULL;
    int rc = -1;
    if (normalize(t, text, len, &b))
        goto done;
    size_t n = b.n;
    if (n == 0) {
        rc = 0;
        goto done;
    }
    if (n > UINT32_MAX - 1 || !(best = malloc((n + 1) * sizeof *best)) ||
        !(path = malloc((n + 1) * sizeof *path)))
        goto done;
    best[0] = (ugm_best){0.0, -1, 0};
    for (size_t i = 1; i <= n; i++)
        best[i] = (ugm_best){-DBL_MAX, -1, 0};
    for (size_t pos = 0; pos < n;) {
        size_t mblen = tok_utf8_len((unsigned char)b.p[pos]);
        if (mblen > n - pos)
            mblen = n - pos;
        if (!offer_pieces(t, b.p, n, pos, mblen, best)) {
            double score = best[pos].score + t->ugm_unknown_score;
            if (score > best[pos + mblen].score)
                best[pos + mblen] = (ugm_best){score, -1, (uint32_t)pos};
        }
        pos += mblen;
    }
    /* the path backwards, then forwards, a run of unknowns as one */
    size_t k = 0;
    for (size_t end = n; end > 0; end = best[end].start)
        path[k++] = (uint32_t)end;
    for (size_t i = k; i-- > 0;) {
        size_t end = path[i], start = best[end].start;
        if (best[end].id >= 0) {
            tok_out_push(o, best[end].id);
            continue;
        }
        while (i > 0 && best[path[i - 1]].id < 0)
            end = path[--i];
        put_unknown(t, b.p + start, end - start, o);
    }
    rc = 0;
done:
    free(b.p);
    free(best);
    free(path);
    return rc;
}
