/*
 * jsonesc.h — how a JSON string's bytes are written, as Python's
 * json.dumps(ensure_ascii=False) writes them (so Hugging Face's tojson, which chat
 * templates render tools with): '"', '\' and the control characters escaped (\n, \r, \t,
 * \b and \f by name, the others as \u00XX), every other byte as it is. Writers that
 * stream text (the gateway's SSE, the template renderers) escape with it rather than
 * build a json-c object per piece.
 */
#ifndef LLMS_JSONESC_H
#define LLMS_JSONESC_H

#include <stddef.h>

/* The room an escape needs, its NUL included. */
#define JSONESC_MAX 8

/* Whether byte c is written escaped. */
static inline int jsonesc_needed(unsigned char c)
{
    return c < 0x20 || c == '"' || c == '\\';
}

/* The escape of byte c (one jsonesc_needed takes) into esc; esc. */
const char *jsonesc_byte(unsigned char c, char esc[JSONESC_MAX]);

/* Writes the n bytes of s as the inside of a JSON string through put(sink, bytes, len):
 * runs of plain bytes whole, each escape on its own. */
void jsonesc_write(const char *s, size_t n, void (*put)(void *sink, const char *b, size_t len),
                   void *sink);

#endif
