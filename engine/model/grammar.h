/*
 * grammar.h — llama.cpp's GBNF grammars, for constrained sampling: which tokens keep a
 * reply a prefix of a sentence of the grammar.
 *
 * The language is llama.cpp's (its grammars/README.md):
 *   - rules `name ::= alternatives`; a name is letters, digits, '-' and '_'; the sentences
 *     are those of the rule `root`; a rule may be used before it is defined;
 *   - alternatives separated by '|', each a sequence of items: "literal", [class],
 *     [^negated class] (ranges a-z, a '-' first or last is itself), '.' (any character),
 *     a rule's name, ( group ), each optionally repeated: * + ? {m} {m,} {m,n}
 *     (m, n <= GRAMMAR_REPEAT_MAX; an empty alternative matches the empty text);
 *   - escapes in literals and classes: \n \r \t \\ \" \[ \] \- \^ \xHH \uHHHH
 *     \UHHHHHHHH (code points, not bytes: \xE9 is U+00E9);
 *   - `#` comments to the end of the line; spaces and tabs anywhere between tokens; a
 *     newline ends a rule, except inside parentheses and right after `::=` or `|`.
 * Characters are the code points of valid UTF-8 text, surrogates excluded: the grammar is
 * compiled into byte-level structure, so that only valid UTF-8 is ever accepted and a
 * character may be split across tokens.
 *
 * Refused with a message naming the problem and its line:column: syntax errors, invalid
 * UTF-8 or a NUL byte in the text, unknown escapes, surrogates, ranges out of order,
 * classes that match no character, repetition bounds out of order or past
 * GRAMMAR_REPEAT_MAX, token references (<...>, <[id]>: not supported), an undefined
 * rule, no `root`, a rule defined twice (llama.cpp keeps the last definition silently:
 * here it is an error), left recursion (a rule that can begin with itself, also through
 * rules that can match the empty text: its expansion would never end), a rule used by
 * root that can never finish (each of its alternatives goes on for ever), an empty text,
 * a text over GRAMMAR_TEXT_MAX bytes, more than GRAMMAR_RULES_MAX rules or
 * GRAMMAR_ELEMENTS_MAX elements (a repetition counts as its expansion: x{3,5} as three
 * copies of x and two optional ones), and a grammar whose start alone passes the
 * recogniser's bounds below.
 *
 * The recogniser is a set of parse stacks over bytes (each stack the positions still to
 * match in the rules entered, innermost last; identical stacks are kept once). Its bounds:
 *   - at most GRAMMAR_STACKS_MAX stacks at once: the ways the text so far may be read on
 *     (a rule's alternatives that begin alike are merged when it is compiled, so a list of
 *     a thousand words, such as a JSON Schema enum, needs a stack per distinct next byte);
 *   - at most GRAMMAR_DEPTH_MAX positions in a stack: nesting, the rules entered and not
 *     yet finished (a rule called last in an alternative does not count: llama.cpp's
 *     json.gbnf nests 62 arrays or objects);
 *   - at most GRAMMAR_EXPAND_MAX rule expansions to find the stacks after one byte.
 * A byte whose stacks would pass a bound is refused: the text is then still a prefix of a
 * sentence of the grammar, only the sentences that need more are out of reach.
 *
 * Dead ends: every rule the grammar uses can finish, so from any state some byte is taken
 * or the text is complete, except where a bound refuses every byte the grammar allows
 * next (say, a grammar whose every continuation nests deeper than GRAMMAR_DEPTH_MAX).
 * grammar_bounded tells that a bound refused a byte at the current state.
 *
 * Cost: a cursor learns the states its stacks reach as it goes (a lazily built automaton
 * over stack sets, per cursor), so a token's test is a table lookup per byte once its
 * states are known, and the first test of a state costs a step per class of bytes it
 * tells apart. The cursor's memory is allocated once, when it is created (about 2.3 MiB
 * of address space, touched as used); testing and taking tokens never allocate.
 */
#ifndef LLMS_GRAMMAR_H
#define LLMS_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"
#include "engine/tok/tokenizer.h"

/* The longest grammar text, in bytes. */
#define GRAMMAR_TEXT_MAX (256 * 1024)
/* The largest count a repetition {m,n} may name. */
#define GRAMMAR_REPEAT_MAX 1000
/* Rules, at most: the named ones and those made for groups, classes and repetitions. */
#define GRAMMAR_RULES_MAX 65536
/* Elements of the compiled grammar, at most (a byte set or a rule reference each; a
 * character of a literal is one per byte of its UTF-8). */
#define GRAMMAR_ELEMENTS_MAX (1 << 20)
/* Parentheses open at once in the text, at most. */
#define GRAMMAR_NESTING_MAX 64

/* The recogniser's bounds (see above). */
#define GRAMMAR_STACKS_MAX 256
#define GRAMMAR_DEPTH_MAX 128
#define GRAMMAR_EXPAND_MAX 4096

/* A compiled grammar: immutable, shareable by any number of cursors and threads. */
typedef struct grammar grammar;

/* Compiles text[0..n) (it need not end in a NUL). 0 with *out, or -1 with err naming the
 * problem and its line:column (*out NULL). */
int grammar_compile(const char *text, size_t n, grammar **out, char err[ERR_MAX]);

/* NULL is fine. */
void grammar_free(grammar *g);

/* Every token's bytes of one tokenizer (tok_pieces): built once per model, immutable,
 * shareable by any number of cursors and threads. */
typedef struct grammar_vocab grammar_vocab;

/* Builds t's table. 0, or -1 with err when memory runs out. */
int grammar_vocab_new(const tokenizer *t, grammar_vocab **out, char err[ERR_MAX]);

/* NULL is fine. */
void grammar_vocab_free(grammar_vocab *v);

/* One reply's state in a grammar, with the scratch its tests use. One thread at a time:
 * even the const queries below write the cursor's scratch. */
typedef struct grammar_cursor grammar_cursor;

/* A cursor at the start of a reply: g and v (NULL for a cursor fed bytes only, which
 * allows no token) must outlive it. 0, or -1 with err when memory runs out. */
int grammar_cursor_new(const grammar *g, const grammar_vocab *v, grammar_cursor **out,
                       char err[ERR_MAX]);

/* NULL is fine. */
void grammar_cursor_free(grammar_cursor *c);

/* Back to the start of a reply (for the next reply on the same grammar: what the cursor
 * learned is kept). */
void grammar_cursor_reset(grammar_cursor *c);

/* Gives dst (a cursor of the same grammar and vocabulary) src's state. 0, or -1 when they
 * are not of the same grammar and vocabulary (dst unchanged). */
int grammar_cursor_copy(grammar_cursor *dst, const grammar_cursor *src);

/* Whether token may come next: the state takes all its bytes, or it ends generation
 * (tok_is_eog) and the text so far is complete. false for a token with no bytes otherwise
 * (control, unknown, unused), an id outside the vocabulary, and every token of a cursor
 * without a vocabulary. The state does not change. */
bool grammar_allows(const grammar_cursor *c, int32_t token);

/* Moves c past token (an end-of-generation token moves nothing). 0, or -1 when
 * grammar_allows says no (c unchanged). */
int grammar_take(grammar_cursor *c, int32_t token);

/* Moves c past n bytes (a prompt's prefill of the reply, tests). 0, or -1 when one of
 * them is refused (c unchanged). */
int grammar_feed(grammar_cursor *c, const void *bytes, size_t n);

/* Whether the text so far is a sentence of the grammar: an end-of-generation token may
 * come. */
bool grammar_complete(const grammar_cursor *c);

/* Whether the text so far is complete and no byte may follow: the reply ends here. */
bool grammar_finished(const grammar_cursor *c);

/* Whether a byte the grammar allows next is refused for one of the recogniser's bounds
 * (GRAMMAR_STACKS_MAX, GRAMMAR_DEPTH_MAX, GRAMMAR_EXPAND_MAX). */
bool grammar_bounded(const grammar_cursor *c);

#endif
