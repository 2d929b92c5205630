/*
 * tokenizer.h — text <-> token ids, built from the tokenizer metadata of a GGUF file.
 *
 * Four kinds, chosen by tokenizer.ggml.model, each reproducing llama.cpp's output:
 *   "llama"  SentencePiece-style: '▁' for spaces, score-ordered merges, <0xXX> byte fallback
 *   "gpt2"   byte-level BPE: pre-tokenizer regexes named by tokenizer.ggml.pre, ranked merges
 *   "bert"   WordPiece: lowercase, accents stripped, greedy longest match per word
 *   "t5"     SentencePiece Unigram: the file's NFKC charsmap, then the segmentation of
 *            highest score (T5, XLM-RoBERTa: bge-m3, bge-reranker-v2-m3, multilingual-e5)
 *
 * A tokenizer copies everything it needs, so the gguf_file may be closed after tok_load.
 * It is immutable after loading: all functions below may be called from several threads
 * at once on the same tokenizer.
 */
#ifndef LLMS_TOKENIZER_H
#define LLMS_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"
#include "engine/gguf/gguf.h"

typedef struct tokenizer tokenizer;

enum tok_model {
    TOK_MODEL_SPM = 1, /* "llama" */
    TOK_MODEL_BPE = 2, /* "gpt2" */
    TOK_MODEL_WPM = 3, /* "bert" */
    TOK_MODEL_UGM = 4, /* "t5": SentencePiece Unigram */
};

/* Token types, as stored in tokenizer.ggml.token_type. */
enum tok_type {
    TOK_TYPE_INVALID = 0, /* returned for an id outside the vocabulary */
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
};

/* Special token roles for tok_special(). The fill-in-the-middle roles are found as
 * llama.cpp finds them: the tokenizer.ggml.fim_{pre,suf,mid,pad,rep,sep}_token_id keys,
 * then the older tokenizer.ggml.{prefix,suffix,middle}_token_id (read after them, so
 * they win), else a control or user-defined token of a spelling llama.cpp knows
 * ("<|fim_prefix|>" of Qwen, "<fim-prefix>", "<fim_prefix>" of StarCoder2, DeepSeek's,
 * "<PRE>", ...). */
enum tok_special {
    TOK_SPECIAL_BOS,
    TOK_SPECIAL_EOS,
    TOK_SPECIAL_EOT, /* end of turn (chat) */
    TOK_SPECIAL_EOM, /* end of message (tool call) */
    TOK_SPECIAL_UNK,
    TOK_SPECIAL_SEP,
    TOK_SPECIAL_PAD,
    TOK_SPECIAL_CLS,
    TOK_SPECIAL_MASK,
    TOK_SPECIAL_FIM_PRE, /* before the code that comes before the hole */
    TOK_SPECIAL_FIM_SUF, /* before the code that comes after it */
    TOK_SPECIAL_FIM_MID, /* after both: what follows fills the hole */
    TOK_SPECIAL_FIM_PAD, /* ends generation */
    TOK_SPECIAL_FIM_REP, /* before a repository's name (repo-level context); ends generation */
    TOK_SPECIAL_FIM_SEP, /* before each file of repo-level context; ends generation */
    TOK_SPECIAL_COUNT,
};

/*
 * Builds a tokenizer from the tokenizer.* metadata of g. Everything is validated:
 * an unknown model or pre-tokenizer name, a missing or mistyped array, arrays of
 * different lengths, a token type outside 1..6, a special token id outside the
 * vocabulary, or a merge naming a token that is not in the vocabulary gives -1 and a
 * message in err. Keys that are absent take llama.cpp's defaults for the model kind
 * (e.g. SPM: BOS 1, EOS 2, UNK 0, add BOS, add space prefix; a missing
 * tokenizer.ggml.pre means "default"). On success *out owns the tokenizer.
 */
int tok_load(const gguf_file *g, tokenizer **out, char err[ERR_MAX]);

/* Frees a tokenizer (NULL is fine). */
void tok_free(tokenizer *t);

/*
 * Tokenizes len bytes of text (any bytes; need not be NUL-terminated nor valid UTF-8).
 *   add_special    add the model's BOS / EOS (WordPiece: CLS ... SEP) as its
 *                  tokenizer.ggml.add_*_token flags say.
 *   parse_special  text equal to a control or unknown token (e.g. "<|im_end|>")
 *                  becomes that token; otherwise it is tokenized as plain text.
 *                  User-defined tokens are always recognised (as llama.cpp does).
 * Returns the number of tokens n; the first min(n, max_out) are written to out. When
 * n > max_out, call again with a buffer of n. Returns -1 only when memory runs out, the
 * regex engine fails (PCRE2's match limits, not reached by ordinary text), or
 * the arguments are invalid (len > INT32_MAX / 4, max_out < 0, out NULL with max_out > 0).
 */
int tok_encode(const tokenizer *t, const char *text, size_t len, bool add_special,
               bool parse_special, int32_t *out, int max_out);

/*
 * The bytes one token stands for: SPM '▁' becomes ' ' and <0xXX> the byte, BPE
 * byte-level characters map back to bytes, WordPiece word-initial '▁' becomes ' '.
 * Control, unknown and user-defined tokens give their text as written in the
 * vocabulary ("<|im_end|>"); unused tokens give nothing. Like snprintf: returns the
 * piece's length, writes at most cap - 1 bytes of it and a NUL (when cap > 0); the
 * piece may itself contain NUL bytes. Returns -1 for an id outside the vocabulary.
 */
int tok_piece(const tokenizer *t, int32_t id, char *buf, size_t cap);

/* The length of the longest piece of the vocabulary: a buffer of this plus 1 bytes holds
 * any token's tok_piece whole. */
size_t tok_max_piece_len(const tokenizer *t);

/* Every token's bytes as a reply shows them (tok_piece's), back to back: what the
 * constraints on a reply's text (JSON mode, grammars) test tokens by. A token has bytes
 * when it stands for text of a reply: a normal, byte or user-defined token that does not
 * end generation. Control, unknown and unused tokens are markup and have none, and an
 * end-of-generation token (tok_is_eog) ends the reply whatever its type, so it has none
 * either. Immutable once built: it may be shared by any number of threads. */
typedef struct tok_pieces {
    int32_t n_vocab;
    uint32_t *start; /* (n_vocab + 1) token i's bytes are bytes[start[i], start[i + 1]) */
    uint8_t *bytes;  /* (start[n_vocab] + 1) every token's bytes, back to back, then a NUL */
} tok_pieces;

/* Builds t's table into *out. 0, or -1 with err when memory runs out (or the pieces pass
 * 4 GiB); *out then holds nothing to free. */
int tok_pieces_new(const tokenizer *t, tok_pieces *out, char err[ERR_MAX]);

/* Frees the table's arrays (a zeroed one is fine). */
void tok_pieces_free(tok_pieces *p);

/*
 * Text of a token sequence: the pieces concatenated, except that
 *   - the space the SPM encoder prefixes (at the start, and after each special token)
 *     is removed: one leading space of the first piece of text at the start or after a
 *     control / unknown / user-defined token; for WordPiece the leading space of the
 *     whole text;
 *   - remove_special drops a leading BOS (when the model adds BOS) and a trailing EOS
 *     (when it adds EOS);
 *   - control and unknown tokens give nothing unless unparse_special.
 * So decode(encode(s)) == s for SPM and BPE, also with parse_special / unparse_special.
 * Same return contract as tok_piece (length of the whole text, snprintf-like);
 * -1 if an id is outside the vocabulary or n < 0.
 */
int tok_decode(const tokenizer *t, const int32_t *ids, int n, bool remove_special,
               bool unparse_special, char *buf, size_t cap);

enum tok_model tok_model(const tokenizer *t);
int32_t tok_n_vocab(const tokenizer *t);

/* Id of a special token role, or -1 when the vocabulary has none. */
int32_t tok_special(const tokenizer *t, enum tok_special which);
int32_t tok_bos(const tokenizer *t);
int32_t tok_eos(const tokenizer *t);

/* Whether encoding with add_special adds BOS / EOS. */
bool tok_add_bos(const tokenizer *t);
bool tok_add_eos(const tokenizer *t);

/* End of generation: EOS, EOT, EOM, FIM_PAD, FIM_REP, FIM_SEP (as llama.cpp adds them),
 * or a control token known to end a turn ("<|eot_id|>", "<|im_end|>", "<|end|>",
 * "<end_of_turn>", "<|endoftext|>", "<|END_OF_TURN_TOKEN|>", ...). */
bool tok_is_eog(const tokenizer *t, int32_t id);

/* The end-of-generation tokens, at most (the roles EOS, EOT, EOM and the three FIM ones,
 * and the known texts above). */
#define TOK_EOG_MAX 19

/* Every token tok_is_eog says yes to, in *ids (the tokenizer's; at most TOK_EOG_MAX):
 * their count. What a sampler bans to generate past the end (llama.cpp's ignore_eos). */
int tok_eog_tokens(const tokenizer *t, const int32_t **ids);

/* Type of a token, TOK_TYPE_INVALID for an id outside the vocabulary. */
enum tok_type tok_type(const tokenizer *t, int32_t id);

/* The token's text as stored in the vocabulary (NUL-terminated; *len, if not NULL,
 * receives its length, which counts any embedded NUL). NULL for a bad id. */
const char *tok_token_text(const tokenizer *t, int32_t id, size_t *len);

/* Id of the token whose vocabulary text is exactly text[0..len), or -1. When several
 * tokens share a text, the last one (as llama.cpp does). */
int32_t tok_find(const tokenizer *t, const char *text, size_t len);

#endif
