/*
 * regex.h — a JSON Schema "pattern" (an ECMA-262 regular expression) compiled into a
 * deterministic automaton over the UTF-8 bytes of a string, so that a model writing the
 * string byte by byte is held to the pattern: two loads per byte, a state of 16 bits
 * that is copied with the writer's, and no dead ends (from every state but REGEX_DEAD some
 * continuation is accepted, so a writer that follows the automaton can always finish).
 *
 * What is taken (ECMA-262 without flags, as JSON Schema, OpenAI and Pydantic write it):
 *   - literal characters (any UTF-8), '.' (any character but \n \r U+2028 U+2029);
 *   - escapes \d \D \w \W \s \S (ECMA's: \d and \w are ASCII, \s takes Unicode's spaces),
 *     \t \n \v \f \r \0 \cX \xHH \uHHHH (a surrogate pair as one character) and any ASCII
 *     punctuation or space escaped as itself (\. \/ \- ...);
 *   - classes [...] and [^...] with ranges and those escapes ([\b] is U+0008); [] matches
 *     nothing and [^] any character, as in ECMA;
 *   - groups ( ), (?: ), (?<name> ) (captures do not change what matches), alternation;
 *   - repeats * + ? {n} {n,} {n,m}, lazy or not (the same strings match), counts up to
 *     REGEX_REPEAT_MAX;
 *   - ^ at the start of the pattern or of one of its alternatives, $ at the end of either.
 * Refused, naming the construct and its byte offset: lookarounds, backreferences, \b and
 * \B, anchors elsewhere, \p{...}, \u{...}, other (?...) groups and escapes, a lone ] { or
 * }, and what is not ECMA-262 syntax.
 *
 * The automaton is immutable after regex_compile: any number of threads may step it.
 */
#ifndef LLMS_REGEX_H
#define LLMS_REGEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"

typedef struct regex_dfa regex_dfa;

/* The state no string leads out of: what a refused byte leads to. */
#define REGEX_DEAD 0

/* The most states an automaton may have (REGEX_DEAD included), at every step of its
 * construction. A length bound multiplies a pattern's states by the characters still
 * allowed, and a character of several bytes needs states between its bytes (7 for any
 * character, 9 for '.'): 16384 holds ^[^<>]*$ up to some 2000 characters, .{0,1000}, and
 * ^[a-z]*$ up to some 16000 characters. */
#define REGEX_STATES_MAX 16384

/* The largest count a repeat ({n,m}) may name. */
#define REGEX_REPEAT_MAX 1000

/* The most steps (NFA states visited) the construction of an automaton may take: some
 * tenths of a second. */
#define REGEX_WORK_MAX (1u << 23)

/* Compiles pattern (len bytes) into an automaton whose accepted strings are exactly those
 * that:
 *   - the pattern matches: JSON Schema's patterns are not anchored, so "abc" matches any
 *     string that contains abc; a leading ^ or a trailing $ anchors;
 *   - are min_chars to max_chars characters (code points) long; max_chars UINT32_MAX is
 *     no bound;
 *   - have no control character other than \b \t \n \f \r (JSON writes only those
 *     without a \u escape, which the writer is not given).
 * Every state but REGEX_DEAD reaches an accepting one. 0 with *out; -1 with err naming
 * what is not supported or malformed (with its byte offset), invalid UTF-8, a language that
 * is empty within the lengths, a pattern longer than 256 KiB, or an automaton past
 * REGEX_STATES_MAX states or too costly to build (the construction's steps and memory
 * are bounded, so that a refusal comes in a fraction of a second). */
int regex_compile(const char *pattern, size_t len, uint32_t min_chars, uint32_t max_chars,
                  regex_dfa **out, char err[ERR_MAX]);

/* regex_compile with a budget shared among patterns: *work holds the construction steps
 * of the caller's earlier patterns and gets this one's added; the sum may not pass
 * REGEX_WORK_MAX. A client's request that brings many patterns (a JSON Schema's) then
 * costs no more time to refuse or compile than one pattern. */
int regex_compile_sharing(const char *pattern, size_t len, uint32_t min_chars,
                          uint32_t max_chars, uint64_t *work, regex_dfa **out, char err[ERR_MAX]);

/* NULL is fine. */
void regex_free(regex_dfa *dfa);

/* The state before the first byte: never REGEX_DEAD. */
uint16_t regex_start(const regex_dfa *dfa);

/* The state after byte from state (one of dfa's): REGEX_DEAD if the byte is refused, and
 * from REGEX_DEAD. */
uint16_t regex_step(const regex_dfa *dfa, uint16_t state, uint8_t byte);

/* Whether the bytes that led to state are a whole accepted string. */
bool regex_accepts(const regex_dfa *dfa, uint16_t state);

/* The memory the automaton holds (its table), for a caller bounding many of them. */
size_t regex_bytes(const regex_dfa *dfa);

#endif
