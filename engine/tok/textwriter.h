/*
 * textwriter.h — snprintf-style output for the chat template writers (chat.c,
 * chattools.c): each write puts what still fits in the buffer and counts everything, so
 * that a first pass with no buffer measures the text and a second writes it.
 */
#ifndef LLMS_TEXTWRITER_H
#define LLMS_TEXTWRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

typedef struct textwriter {
    char *out;  /* (cap) the buffer, NULL with cap 0 to measure */
    size_t cap;
    size_t len; /* bytes written or, past cap, that would have been */
} textwriter;

static inline void textwriter_put_n(textwriter *w, const char *s, size_t n)
{
    if (w->len < w->cap) {
        size_t room = w->cap - w->len;
        memcpy(w->out + w->len, s, n < room ? n : room);
    }
    w->len += n;
}

static inline void textwriter_put(textwriter *w, const char *s)
{
    textwriter_put_n(w, s, strlen(s));
}

/* White space as Jinja's trim and Python's str.strip() see it (ASCII). */
static inline bool textwriter_is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* s[0..n) with its leading and trailing white space removed (Jinja's trim). */
static inline void textwriter_put_trimmed_n(textwriter *w, const char *s, size_t n)
{
    while (n > 0 && textwriter_is_space(*s))
        s++, n--;
    while (n > 0 && textwriter_is_space(s[n - 1]))
        n--;
    textwriter_put_n(w, s, n);
}

/* s with its leading and trailing white space removed. */
static inline void textwriter_put_trimmed(textwriter *w, const char *s)
{
    textwriter_put_trimmed_n(w, s, strlen(s));
}

#endif
