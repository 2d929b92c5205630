/*
 * stop.h — cutting generated text at stop strings.
 *
 * Text arrives piece by piece (one token's bytes at a time). stop_feed() writes out the
 * bytes that are safe to show now and holds back a tail that could still be the start
 * of a stop string. Once a stop string is complete, the text before it is released and
 * the matcher is done: the stop string and anything after it are never emitted. When
 * generation ends for another reason, stop_flush() releases the held tail.
 *
 * Matching is on bytes. Token pieces may split a UTF-8 character; the matcher also holds
 * back such an incomplete character until its remaining bytes arrive, so emitted text
 * never ends inside one (only stop_flush may release an incomplete tail). The matcher is
 * a plain struct with fixed buffers: no allocation.
 */
#ifndef LLMS_STOP_H
#define LLMS_STOP_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/err.h"

#define STOP_MAX 16      /* stop strings per matcher */
#define STOP_MAX_LEN 64  /* bytes per stop string */

/* The fields are private; the struct is public so that callers can embed it. */
typedef struct stop_matcher {
    int n;
    size_t len[STOP_MAX];
    char str[STOP_MAX][STOP_MAX_LEN];
    size_t n_held;
    char held[STOP_MAX_LEN]; /* a proper prefix of a stop string or a split UTF-8
                                character, so < STOP_MAX_LEN */
    int hit;                 /* index of the stop string that completed, or -1 */
} stop_matcher;

/* Sets up a matcher for n (0..STOP_MAX) non-empty stop strings of at most STOP_MAX_LEN
 * bytes each (copied). Returns 0, or -1 with err naming the bad string. */
int stop_init(stop_matcher *m, const char *const *strings, int n, char err[ERR_MAX]);

/* Forgets held bytes and a completed match, keeping the stop strings. */
void stop_reset(stop_matcher *m);

/* Room for out that always suffices for a piece of len bytes (held bytes plus piece). */
#define STOP_OUT_CAP(len) ((len) + STOP_MAX_LEN)

/*
 * Feeds the next piece (len bytes, need not be NUL-terminated). Writes the bytes that
 * may be emitted now to out (not NUL-terminated; STOP_OUT_CAP(len) bytes of room always
 * suffice) and returns their count. Returns 0 without looking at the piece once the
 * matcher is done, and -1 when cap is smaller than the held bytes plus the piece (the
 * state is then unchanged).
 */
long stop_feed(stop_matcher *m, const char *piece, size_t len, char *out, size_t cap);

/* Releases the held tail at the end of generation (out needs STOP_MAX_LEN bytes).
 * Returns the count written; 0 once a stop string has completed. */
size_t stop_flush(stop_matcher *m, char *out);

/* Index of the stop string that completed, or -1 while none has. */
int stop_hit(const stop_matcher *m);

/* The stop string that completed, NUL-terminated in out; its length, 0 while none has
 * (out is then ""). */
size_t stop_hit_text(const stop_matcher *m, char out[STOP_MAX_LEN + 1]);

#endif
