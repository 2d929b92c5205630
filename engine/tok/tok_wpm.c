/*
 * tok_wpm.c — WordPiece encoding ("bert" vocabularies), as llama.cpp does it.
 *
 * Each code point is reduced to the first code point of its canonical decomposition
 * (which strips accents) and lowercased. Whitespace ends a word, control characters
 * vanish, and punctuation, ASCII symbols and CJK ideographs are words of their own.
 * A word, prefixed with '▁' (how llama.cpp's vocabularies mark word starts), is cut
 * greedily into the longest vocabulary tokens; a word that cannot be cut entirely is
 * one [UNK].
 */
#include <stdlib.h>
#include <string.h>

#include "engine/tok/tok_internal.h"
#include "engine/tok/utf8.h"

enum { C_OTHER, C_SPACE, C_CONTROL, C_SPLIT };

/* Groups: 1 whitespace, 2 dropped (control, U+FFFD), 3 punctuation or CJK ideograph. */
static const char class_regex[] =
    "([\\x{85}\\p{Z}])|([\\p{Cc}\\p{Cf}\\p{Co}\\p{Cs}\\x{FFFD}])"
    "|([\\p{P}\\x{4E00}-\\x{9FFF}\\x{3400}-\\x{4DBF}\\x{20000}-\\x{2A6DF}\\x{2A700}-\\x{2B73F}"
    "\\x{2B740}-\\x{2B81F}\\x{2B920}-\\x{2CEAF}\\x{F900}-\\x{FAFF}\\x{2F800}-\\x{2FA1F}])";

int tok_wpm_setup(tokenizer *t, char err[ERR_MAX])
{
    int code;
    PCRE2_SIZE at;
    t->wpm_class = pcre2_compile((PCRE2_SPTR)class_regex, PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &code, &at, NULL);
    if (!t->wpm_class)
        return err_set(err, "WordPiece character classes: PCRE2 error %d at %zu", code, (size_t)at);
    return 0;
}

static int classify(const tokenizer *t, pcre2_match_data *md, uint32_t cp)
{
    if (cp < 0x80) {
        if ((cp >= 9 && cp <= 13) || cp == ' ')
            return C_SPACE;
        if (cp < 0x20 || cp == 0x7f)
            return C_CONTROL;
        if ((cp >= '0' && cp <= '9') || (cp >= 'A' && cp <= 'Z') || (cp >= 'a' && cp <= 'z'))
            return C_OTHER;
        return C_SPLIT; /* ASCII punctuation and symbols */
    }
    char u[4];
    size_t n = utf8_encode(cp, u);
    int rc = pcre2_match(t->wpm_class, (PCRE2_SPTR)u, n, 0, 0, md, NULL);
    if (rc <= 1)
        return C_OTHER;
    return rc == 2 ? C_SPACE : rc == 3 ? C_CONTROL : C_SPLIT;
}

/* Greedy longest-match of word[0..n) (which starts with '▁'). */
static void encode_word(const tokenizer *t, const char *word, size_t n, tok_out *o)
{
    int start = o->n;
    for (size_t i = 0; i < n; i++) {
        size_t j = i + t->max_token_len + 1 < n ? i + t->max_token_len + 1 : n;
        for (; j > i; j--) {
            int32_t id = tok_lookup(t, word + i, j - i);
            if (id >= 0) {
                tok_out_push(o, id);
                i = j - 1;
                break;
            }
        }
        if (j == i) {
            o->n = start;
            break;
        }
    }
    if (o->n == start && t->special_id[TOK_SPECIAL_UNK] >= 0)
        tok_out_push(o, t->special_id[TOK_SPECIAL_UNK]);
}

int tok_wpm_encode(const tokenizer *t, const char *text, size_t len, tok_out *o)
{
    char *word = malloc(len * 4 + 8);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->wpm_class, NULL);
    if (!word || !md) {
        free(word);
        pcre2_match_data_free(md);
        return -1;
    }
    static const char ws[3] = {'\xe2', '\x96', '\x81'};
    memcpy(word, ws, 3);
    size_t n = 3; /* bytes in word, after the '▁' */
    for (size_t i = 0; i < len;) {
        size_t used;
        uint32_t cp = tok_ucd_nfd_first(tok_utf8_decode(text + i, len - i, &used));
        i += used;
        int c = classify(t, md, cp);
        if (c == C_SPACE || c == C_SPLIT) {
            if (n > 3)
                encode_word(t, word, n, o);
            n = 3;
        }
        if (c == C_SPACE || c == C_CONTROL)
            continue;
        n += utf8_encode(tok_ucd_lower(cp), word + n);
        if (c == C_SPLIT) {
            encode_word(t, word, n, o);
            n = 3;
        }
    }
    if (n > 3)
        encode_word(t, word, n, o);
    free(word);
    pcre2_match_data_free(md);
    return 0;
}
