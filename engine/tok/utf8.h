/*
 * utf8.h — keeping text valid UTF-8 where it leaves the process: pieces of a reply
 * streamed as they are generated (a token may end inside a character, and a model may
 * produce bytes that are no UTF-8 at all), and JSON strings.
 *
 * The byte ranges of a range of characters serve the automata that take text byte by
 * byte (a JSON Schema pattern's, a grammar's).
 *
 * Invalid bytes become U+FFFD (the replacement character), one per byte, as the
 * WHATWG decoder does; overlong forms, surrogates and code points past U+10FFFF are
 * invalid.
 */
#ifndef LLMS_UTF8_H
#define LLMS_UTF8_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The bytes of the UTF-8 sequence starting at s (n bytes available): 1..4 for a
 * whole valid one, 0 when s[0] starts no valid sequence, -1 when s[0..n) is a valid
 * but unfinished prefix of one. n must be at least 1. */
int utf8_seq(const char *s, size_t n);

/* Whether s[0..n) is all valid UTF-8 (whole sequences only). */
int utf8_valid(const char *s, size_t n);

/* Encodes code point cp (at most U+10FFFF) into buf (4 bytes of room); returns the
 * bytes written. */
size_t utf8_encode(uint32_t cp, char *buf);

/* The most parts utf8_ranges splits a range of code points into: at most 1, 3, 5 and 7
 * for the characters of 1, 2, 3 and 4 bytes. */
#define UTF8_RANGES_MAX 16

/* Byte strings of one length: those whose byte i lies in [lo[i], hi[i]] for each i. */
typedef struct utf8_range {
    uint8_t len;   /* 1..4 */
    uint8_t lo[4]; /* (len) */
    uint8_t hi[4]; /* (len) */
} utf8_range;

/* Splits the code points lo..hi (lo <= hi <= U+10FFFF, no surrogate among them) into
 * byte ranges whose byte strings are exactly those characters' encodings, as RE2 and
 * Rust's utf8-ranges split them: each part's characters have one length and their
 * encodings are all the byte strings between its ends' encodings, byte by byte. The
 * parts are disjoint. Writes them to out and returns how many. */
int utf8_ranges(uint32_t lo, uint32_t hi, utf8_range out[UTF8_RANGES_MAX]);

/* A stream of bytes released as valid UTF-8: an unfinished sequence at the end of a
 * feed is held until the bytes that finish it (or show it invalid) arrive. A NUL byte
 * (a model's byte-fallback token) is released as U+FFFD too, so that the text stays one
 * C string, as it leaves the daemon. Zero it to start. */
typedef struct utf8_stream {
    char held[4];
    size_t n_held;
} utf8_stream;

/* The output room a feed of n bytes (or a flush, n = 0) needs: every byte, held ones
 * included, may become a 3-byte U+FFFD. */
#define UTF8_OUT_CAP(n) (3 * ((size_t)(n) + 3))

/* Takes n bytes and writes to out the valid text they complete (invalid bytes as
 * U+FFFD); returns the bytes written. out has UTF8_OUT_CAP(n) bytes of room. */
size_t utf8_stream_feed(utf8_stream *u, const char *in, size_t n, char *out);

/* Ends the stream: a held unfinished sequence is written as U+FFFD. Returns the bytes
 * written (out has UTF8_OUT_CAP(0) bytes of room). */
size_t utf8_stream_flush(utf8_stream *u, char *out);

/* Writes s (NUL-terminated; NULL writes null) to f as a JSON string: quote, backslash
 * and control characters escaped, invalid UTF-8 as U+FFFD. */
void utf8_json_string(FILE *f, const char *s);

#endif
