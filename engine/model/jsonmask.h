/*
 * jsonmask.h — JSON mode: which tokens keep a reply a valid prefix of one JSON object.
 *
 * A byte-level recogniser of RFC 8259 text (a pushdown automaton whose stack holds each
 * open object or array and its schema node) and, over it, a table of every token's
 * bytes, so that a sampler can draw only tokens that keep the reply a prefix of a JSON
 * object (llama.cpp's grammar sampling with its json grammar, OpenAI's response_format
 * json_object), or of an instance of a JSON Schema (jsonschema.h: OpenAI's json_schema,
 * ollama's format with a schema).
 *
 * What the recogniser accepts is RFC 8259's JSON-text with three bounds, so that a model
 * cannot run on forever inside the structure:
 *   - the top-level value is an object (with a schema: an object or an array);
 *   - at most JSONMASK_DEPTH_MAX objects and arrays are open at once: at the limit
 *     another '{' or '[' is refused;
 *   - at most JSONMASK_WS_MAX whitespace bytes in a row (before the object too);
 * and one choice: nothing may follow the object's closing '}' (the reply ends there).
 * Strings must be valid UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF;
 * a character may be split across tokens) and hold no control character U+0000-U+001F
 * unescaped. \uXXXX takes any four hex digits, as RFC 8259's grammar does.
 *
 * The state is a small fixed-size value: stepping and copying it never allocates.
 */
#ifndef LLMS_JSONMASK_H
#define LLMS_JSONMASK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"
#include "engine/model/jsonschema.h"
#include "engine/tok/tokenizer.h"

/* Objects and arrays open at once, at most (bit i of the stack word: depth i + 1). */
#define JSONMASK_DEPTH_MAX 32
/* Whitespace bytes in a row, at most (llama.cpp's json grammar allows 20 after a
 * newline). */
#define JSONMASK_WS_MAX 20

/* An open object or array. */
typedef struct jsonmask_frame {
    uint16_t node; /* its schema node */
    uint16_t next; /* object: the index of the first property that may still come (a
                      closed object's); array: items so far, to JSONSCHEMA_COUNT_MAX */
} jsonmask_frame;

/* Where the recogniser is in the text. Its fields are the recogniser's own: set it with
 * jsonmask_init (or jsonmask_init_schema) and change it only through jsonmask_feed. */
typedef struct jsonmask_state {
    const jsonschema *schema; /* what the text must be an instance of */
    uint64_t cand;     /* M_KEY: bit i: property i of the object still matches the key;
                          M_ENUM: the spellings still matching, [low 32 bits, high 32) */
    uint64_t num;      /* a bounded integer: the magnitude of its digits so far */
    uint32_t str_len;  /* a length-bounded string: its characters so far */
    uint32_t stack;    /* bit i: the container at depth i + 1 is an array (else object) */
    uint16_t node;     /* the schema node of the value expected next, or being read */
    uint16_t pos;      /* M_KEY, M_ENUM: the bytes of the spelling matched so far */
    uint16_t re;       /* a patterned string: its automaton's state (regex.h) */
    uint8_t depth;     /* open containers, 0..JSONMASK_DEPTH_MAX */
    uint8_t mode;      /* what the next byte may be (jsonmask.c's enum mode) */
    uint8_t count;     /* the mode's counter: \u hex digits to come, a literal's next
                          letter, UTF-8 continuation bytes to come */
    uint8_t literal;   /* which of true, false, null is being spelled */
    uint8_t utf8_lo;   /* the range of the next UTF-8 continuation byte */
    uint8_t utf8_hi;
    uint8_t ws_run;    /* whitespace bytes just before the next */
    bool key;          /* the string being read is a free object's key */
    bool neg;          /* the number being read has a minus sign */
    bool counted;      /* the string being read has a length bound: its characters count */
    bool patterned;    /* the string being read follows an automaton: its decoded bytes
                          step it */
    uint8_t num_len;   /* a bounded number: the bytes of num_text */
    char num_text[JSONSCHEMA_NUMBER_CHARS]; /* a bounded number's spelling so far */
    jsonmask_frame frame[JSONMASK_DEPTH_MAX]; /* (depth) the open containers, outermost first */
} jsonmask_state;

/* The state before the first byte of a reply that must be a JSON object. */
void jsonmask_init(jsonmask_state *s);

/* The state before the first byte of a reply that must be an instance of schema (an
 * object or an array; see jsonschema.h), which must outlive the state. */
void jsonmask_init_schema(jsonmask_state *s, const jsonschema *schema);

/* Feeds n bytes. true: the text so far is still a prefix of a JSON object (within the
 * bounds above) and of an instance of the schema; false: byte by byte, one was refused,
 * and *s is then unspecified (feed a copy to test bytes without committing to them). */
bool jsonmask_feed(jsonmask_state *s, const void *bytes, size_t n);

/* Whether the text so far is a whole JSON object or, with a schema, a whole instance
 * (nothing more may follow). */
bool jsonmask_complete(const jsonmask_state *s);

/* Every token's bytes of one vocabulary, built once per model and immutable after: it
 * may be shared by every generation on the model, from any thread. */
typedef struct jsonmask_vocab jsonmask_vocab;

/* Builds the table of t's tokens: a token's bytes are tok_piece's (SentencePiece's '▁'
 * a space, a byte-fallback token <0xNN> its byte, byte-level BPE's characters their
 * bytes), which are what a reply shows for it. Control, unknown and unused tokens have
 * none and are never allowed, except the end-of-generation tokens (tok_is_eog), allowed
 * once the object is complete. 0, or -1 with err when memory runs out. */
int jsonmask_vocab_new(const tokenizer *t, jsonmask_vocab **out, char err[ERR_MAX]);

void jsonmask_vocab_free(jsonmask_vocab *v);

int32_t jsonmask_vocab_size(const jsonmask_vocab *v);

/* One reply's constraint: its state and what every test of a token against that state
 * shares (which bytes may come first, and after a whitespace byte: most tokens of
 * byte-level vocabularies start with a space). Fixed size; never allocates. */
typedef struct jsonmask_cursor {
    const jsonmask_vocab *vocab;
    jsonmask_state state;
    uint64_t next_ok[2][4]; /* (2, 256 bits) bit b of [0]: the state takes byte b next;
                               of [1]: it takes a space, then b */
    uint32_t string_room;   /* inside a length-bounded string: the characters it may still
                               take (UINT32_MAX: no bound) */
} jsonmask_cursor;

/* A cursor at the start of a reply on vocabulary v: any JSON object. */
void jsonmask_cursor_init(jsonmask_cursor *c, const jsonmask_vocab *v);

/* A cursor at the start of a reply on vocabulary v that must be an instance of schema,
 * which must outlive the cursor. */
void jsonmask_cursor_init_schema(jsonmask_cursor *c, const jsonmask_vocab *v,
                                 const jsonschema *schema);

/* Whether token may come next: all its bytes are taken by the state, or it ends
 * generation and the object is complete. false for an id outside the vocabulary. */
bool jsonmask_allows(const jsonmask_cursor *c, int32_t token);

/* Moves c past token. 0, or -1 when the token is not allowed (c unchanged). */
int jsonmask_take(jsonmask_cursor *c, int32_t token);

#endif
