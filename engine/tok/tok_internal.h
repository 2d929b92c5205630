/*
 * tok_internal.h — what the tokenizer's files (tokenizer.c, tok_spm.c, tok_bpe.c,
 * tok_wpm.c, tok_ugm.c, tok_ucd.c) share. Not part of the engine's public interface.
 */
#ifndef LLMS_TOK_INTERNAL_H
#define LLMS_TOK_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "engine/tok/tokenizer.h"

#define TOK_MAX_REGEX 6
#define TOK_BYTE_CHARS 0x144 /* the GPT-2 byte-level alphabet lies below this code point */

/* Flags kept per token besides its type. */
enum { TOK_FLAG_EOG = 1 };

struct tokenizer {
    enum tok_model model;
    int32_t n_vocab;

    char *text;         /* all token texts, each NUL-terminated */
    uint32_t *text_off; /* (n_vocab) offset of token i in text */
    uint32_t *text_len; /* (n_vocab) its length in bytes */
    float *scores;      /* (n_vocab) SPM merge priority */
    uint8_t *types;     /* (n_vocab) enum tok_type */
    uint8_t *flags;     /* (n_vocab) TOK_FLAG_* */
    size_t max_token_len;
    size_t max_piece_len; /* the longest tok_piece of any id */

    /* text -> id, open addressing; -1 marks an empty slot */
    int32_t *map; /* (map_mask + 1) */
    uint32_t map_mask;

    /* BPE merges: (left id, right id) -> rank and merged id; open addressing */
    uint64_t *merge_keys;  /* (merge_mask + 1) left << 32 | right, UINT64_MAX empty */
    int32_t *merge_rank;   /* (merge_mask + 1) */
    int32_t *merge_result; /* (merge_mask + 1) */
    uint32_t merge_mask;

    int32_t byte_token[256]; /* SPM: <0xXX>; BPE: the byte's byte-level character; -1 none */
    uint16_t byte_char[256]; /* BPE: byte -> code point of the GPT-2 byte-level alphabet */
    int16_t char_byte[TOK_BYTE_CHARS]; /* BPE: the inverse, -1 for other code points */

    /* control / unknown / user-defined tokens by decreasing text length */
    int32_t *specials;
    int32_t n_specials;

    int32_t special_id[TOK_SPECIAL_COUNT];
    int32_t eog[TOK_EOG_MAX]; /* (n_eog) the tokens flagged TOK_FLAG_EOG, each once */
    int n_eog;
    bool add_bos, add_eos, add_sep, add_space_prefix, ignore_merges;

    pcre2_code *regex[TOK_MAX_REGEX]; /* BPE pre-tokenizer, applied in order */
    int n_regex;
    pcre2_code *wpm_class; /* WordPiece: classifies one non-ASCII code point */

    /* Unigram (tok_ugm.c) */
    uint8_t *charsmap;   /* (charsmap_len) the file's precompiled_charsmap, or NULL */
    size_t charsmap_len;
    int32_t *ugm_pieces; /* (n_ugm_pieces) the normal, user-defined and unused ids, by text */
    int32_t n_ugm_pieces;
    double ugm_unknown_score; /* lowest normal score minus 10: a character no piece covers */
    bool remove_extra_whitespaces, ugm_byte_fallback;
};

/* Growing output of an encode call: counts every token, stores the first cap. */
typedef struct tok_out {
    int32_t *ids;
    int cap;
    int n;
} tok_out;

static inline void tok_out_push(tok_out *o, int32_t id)
{
    if (o->n < o->cap)
        o->ids[o->n] = id;
    o->n++;
}

/* Token id of an exact text, -1 if none. */
int32_t tok_lookup(const tokenizer *t, const char *s, size_t n);

/* Byte length of a UTF-8 sequence from its first byte (1 for stray bytes), as
 * llama.cpp counts it. */
static inline size_t tok_utf8_len(unsigned char c)
{
    static const uint8_t len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return len[c >> 4];
}

/* Decodes one code point at s[0..n); invalid sequences give 0xFFFD and length 1. */
uint32_t tok_utf8_decode(const char *s, size_t n, size_t *used);

/* Unicode tables (tok_ucd.c): simple lowercase, first code point of NFD. */
uint32_t tok_ucd_lower(uint32_t cp);
uint32_t tok_ucd_nfd_first(uint32_t cp);

/* Per-model setup and encoding of one run of plain text (no special tokens). The
 * encoders return 0, or -1 when memory runs out. */
/*
 * The queue of candidate merges SPM and BPE share: adjacent symbol pairs, best first.
 * SPM ranks a pair by its token's score, BPE by its merge rank (lower is better), so a
 * pair carries a priority where higher is better; ties go to the leftmost pair.
 */
typedef struct tok_pair {
    float priority;
    int32_t left, right; /* symbol indices */
    uint32_t size;       /* bytes of the pair when pushed; stale if the symbols changed */
} tok_pair;

typedef struct tok_merge_queue {
    tok_pair *v;
    size_t n, cap;
} tok_merge_queue;

/* Adds a pair; -1 when memory runs out. */
int tok_merge_queue_push(tok_merge_queue *q, tok_pair p);
/* Removes and returns the best pair; q must not be empty. */
tok_pair tok_merge_queue_pop(tok_merge_queue *q);

int tok_bpe_setup(tokenizer *t, const gguf_file *g, char err[ERR_MAX]);
int tok_bpe_encode(const tokenizer *t, const char *text, size_t len, tok_out *o);
int tok_spm_encode(const tokenizer *t, const char *text, size_t len, bool space_prefix, tok_out *o);
int tok_wpm_setup(tokenizer *t, char err[ERR_MAX]);
int tok_ugm_setup(tokenizer *t, const gguf_file *g, char err[ERR_MAX]);
int tok_ugm_encode(const tokenizer *t, const char *text, size_t len, tok_out *o);
int tok_wpm_encode(const tokenizer *t, const char *text, size_t len, tok_out *o);

#endif
