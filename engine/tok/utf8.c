/*
 * utf8.c — UTF-8 validation for streamed text and JSON strings (utf8.h).
 */
#include "engine/tok/utf8.h"

#include <stdbool.h>
#include <string.h>

static const char replacement[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

int utf8_seq(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    unsigned c = u[0], lo = 0x80, hi = 0xBF;
    size_t len;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0; /* below is overlong */
        else if (c == 0xED)
            hi = 0x9F; /* above are surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F; /* above is past U+10FFFF */
    } else {
        return 0;
    }
    for (size_t i = 1; i < len; i++) {
        if (i >= n)
            return -1;
        unsigned b = u[i];
        if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xBF))
            return 0;
    }
    return (int)len;
}

size_t utf8_encode(uint32_t cp, char *buf)
{
    if (cp < 0x80) {
        buf[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        buf[0] = (char)(0xc0 | cp >> 6);
        buf[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        buf[0] = (char)(0xe0 | cp >> 12);
        buf[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        buf[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    buf[0] = (char)(0xf0 | cp >> 18);
    buf[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    buf[2] = (char)(0x80 | (cp >> 6 & 0x3f));
    buf[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

int utf8_ranges(uint32_t lo, uint32_t hi, utf8_range out[UTF8_RANGES_MAX])
{
    static const uint32_t last_of_length[] = {0x7F, 0x7FF, 0xFFFF};
    /* each split pushes one part and shortens the other; every part becomes one output,
     * so the parts waiting are fewer than the outputs */
    struct {
        uint32_t lo, hi;
    } stack[UTF8_RANGES_MAX], r;
    int top = 0, n = 0;
    stack[top].lo = lo;
    stack[top++].hi = hi;
    while (top) {
        r = stack[--top];
        bool split = true;
        while (split) {
            split = false;
            for (int i = 0; i < 3 && !split; i++)
                if (r.lo <= last_of_length[i] && r.hi > last_of_length[i]) {
                    stack[top].lo = last_of_length[i] + 1;
                    stack[top++].hi = r.hi;
                    r.hi = last_of_length[i];
                    split = true;
                }
            for (int i = 1; i < 4 && !split && r.hi >= 0x80; i++) {
                uint32_t m6 = (1u << (6 * i)) - 1;
                if ((r.lo & ~m6) == (r.hi & ~m6))
                    continue;
                if (r.lo & m6) {
                    stack[top].lo = (r.lo | m6) + 1;
                    stack[top++].hi = r.hi;
                    r.hi = r.lo | m6;
                    split = true;
                } else if ((r.hi & m6) != m6) {
                    stack[top].lo = r.hi & ~m6;
                    stack[top++].hi = r.hi;
                    r.hi = (r.hi & ~m6) - 1;
                    split = true;
                }
            }
        }
        char a[4], b[4];
        utf8_range *o = &out[n++];
        o->len = (uint8_t)utf8_encode(r.lo, a);
        utf8_encode(r.hi, b);
        for (int i = 0; i < o->len; i++) {
            o->lo[i] = (uint8_t)a[i];
            o->hi[i] = (uint8_t)b[i];
        }
    }
    return n;
}

int utf8_valid(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        int k = utf8_seq(s + i, n - i);
        if (k <= 0)
            return 0;
        i += (size_t)k;
    }
    return 1;
}

size_t utf8_stream_feed(utf8_stream *u, const char *in, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        u->held[u->n_held++] = in[i];
        while (u->n_held > 0) {
            int k = utf8_seq(u->held, u->n_held);
            if (k < 0)
                break;
            /* a NUL byte would cut the C string the text leaves as (protobuf-c) */
            if (k == 0 || u->held[0] == '\0') {
                memcpy(out + o, replacement, sizeof replacement);
                o += sizeof replacement;
                k = 1;
            } else {
                memcpy(out + o, u->held, (size_t)k);
                o += (size_t)k;
            }
            u->n_held -= (size_t)k;
            memmove(u->held, u->held + k, u->n_held);
        }
    }
    return o;
}

size_t utf8_stream_flush(utf8_stream *u, char *out)
{
    if (u->n_held == 0)
        return 0;
    u->n_held = 0;
    memcpy(out, replacement, sizeof replacement);
    return sizeof replacement;
}

void utf8_json_string(FILE *f, const char *s)
{
    if (!s) {
        fputs("null", f);
        return;
    }
    putc('"', f);
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        int k = utf8_seq(s + i, n - i);
        if (k <= 0) {
            fputs("\\ufffd", f);
            i++;
            continue;
        }
        if (k > 1)
            fwrite(s + i, 1, (size_t)k, f);
        else if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\r')
            fputs("\\r", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\u%04x", c);
        else
            putc(c, f);
        i += (size_t)k;
    }
    putc('"', f);
}
