/* jsonesc.c — JSON string escapes (see jsonesc.h). */
#include "engine/jsonesc.h"

#include <stdio.h>
#include <string.h>

const char *jsonesc_byte(unsigned char c, char esc[JSONESC_MAX])
{
    static const char named[] = "\"\\\n\r\t\b\f", letters[] = "\"\\nrtbf";
    const char *at = c ? strchr(named, c) : NULL;
    if (at)
        snprintf(esc, JSONESC_MAX, "\\%c", letters[at - named]);
    else
        snprintf(esc, JSONESC_MAX, "\\u%04x", c);
    return esc;
}

void jsonesc_write(const char *s, size_t n, void (*put)(void *sink, const char *b, size_t len),
                   void *sink)
{
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        if (!jsonesc_needed((unsigned char)s[i]))
            continue;
        char esc[JSONESC_MAX];
        put(sink, s + run, i - run);
        jsonesc_byte((unsigned char)s[i], esc);
        put(sink, esc, strlen(esc));
        run = i + 1;
    }
    put(sink, s + run, n - run);
}
