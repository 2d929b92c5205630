/*
 * err.h — how engine functions report failure.
 *
 * A function that can fail returns 0 on success and -1 on failure, and writes a
 * human-readable reason into a caller-provided buffer of ERR_MAX bytes (which may be
 * NULL when the caller does not want the text). Messages name what was wrong
 * ("tensor 'blk.3.attn_q.weight': data offset 123 past end of file (size 100)").
 */
#ifndef LLMS_ERR_H
#define LLMS_ERR_H

#define ERR_MAX 256

/* Formats a message into err (if not NULL) and returns -1, so callers can write
 * `return err_set(err, "...", ...);`. */
int err_set(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
