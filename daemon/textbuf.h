/*
 * textbuf.h — a growable NUL-terminated text buffer, for replies and prompts built piece
 * by piece on the worker (a generation's shown text, a retrieval's passages, prediction
 * prompts).
 */
#ifndef LLMS_TEXTBUF_H
#define LLMS_TEXTBUF_H

#include <stddef.h>

/* Appends n bytes of s to *buf (*len bytes used of *cap allocated; all three zero for an
 * empty buffer), growing it by doubling and keeping it NUL-terminated. 0, or -1 when
 * memory runs out (the buffer is then as it was). */
int textbuf_append(char **buf, size_t *len, size_t *cap, const char *s, size_t n);

#endif
