/* harmony.c — a gpt-oss reply told apart as it streams (harmony.h). */
#include "daemon/net/harmony.h"

#include <stdio.h>
#include <string.h>

#define MESSAGE "<|message|>"
#define CALL_CLOSE "}\n</tool_call>"

/* What ends a body. */
static const char *const enders[] = {"<|end|>", "<|return|>", "<|call|>"};
#define N_ENDERS (sizeof enders / sizeof enders[0])

/* How a header may begin: a new message's opening, or (the first, after the prompt's
 * "<|start|>assistant") its channel or recipient. */
static const char *const openings[] = {"<|start|>", "<|channel|>", " to=", "to="};
#define N_OPENINGS (sizeof openings / sizeof openings[0])

void harmony_init(harmony_split *s, bool calls)
{
    memset(s, 0, sizeof *s);
    s->state = HARMONY_HEADER;
    s->calls = calls;
}

/* Whether a[0..n) and b (a C string) agree on their common length. */
static bool agree(const char *a, size_t n, const char *b)
{
    size_t m = strlen(b);
    return memcmp(a, b, n < m ? n : m) == 0;
}

static bool is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-' || c == '.';
}

/* The word after key in the header (NUL-terminated), up to a space or '<', in out. */
static void header_word(const char *header, const char *key, char *out, size_t cap)
{
    const char *p = strstr(header, key);
    size_t n = 0;
    if (p)
        for (p += strlen(key); *p && *p != ' ' && *p != '<' && n + 1 < cap; p++)
            out[n++] = *p;
    out[n] = '\0';
}

/* The header read (without its "<|message|>"): what its body is. */
static void open_body(harmony_split *s)
{
    char header[HARMONY_HEADER_MAX + 1], channel[HARMONY_HEADER_MAX], to[HARMONY_HEADER_MAX];
    memcpy(header, s->header, s->n_header);
    header[s->n_header - strlen(MESSAGE)] = '\0';
    header_word(header, "<|channel|>", channel, sizeof channel);
    header_word(header, "to=", to, sizeof to);
    s->body = strcmp(channel, "analysis") == 0 ? HARMONY_REASONING : HARMONY_CONTENT;
    const char *name = strncmp(to, "functions.", 10) == 0 ? to + 10 : NULL;
    bool named = name && *name;
    for (const char *p = name; named && *p; p++)
        named = is_name_char(*p);
    if (named && s->calls) {
        s->body = HARMONY_CALL;
        snprintf(s->call_open, sizeof s->call_open,
                 "<tool_call>\n{\"name\": \"%s\", \"arguments\": ", name);
    }
    s->state = HARMONY_BODY;
    s->n_header = 0;
}

/* A body's run. */
static int give(harmony_split *s, const char *text, size_t n, harmony_emit emit, void *arg)
{
    if (n == 0)
        return 0;
    return emit(arg, s->body == HARMONY_REASONING, text, n);
}

/* The body ends: a call's closing goes out. */
static int close_body(harmony_split *s, harmony_emit emit, void *arg)
{
    bool call = s->body == HARMONY_CALL;
    s->state = HARMONY_HEADER;
    s->body = HARMONY_CONTENT;
    return call ? emit(arg, false, CALL_CLOSE, strlen(CALL_CLOSE)) : 0;
}

/* The body's held bytes after one more: an ender closes the body; bytes that can no
 * longer begin one go out. */
static int settle(harmony_split *s, harmony_emit emit, void *arg)
{
    while (s->n_held > 0) {
        bool prefix = false;
        for (size_t k = 0; k < N_ENDERS; k++) {
            if (s->n_held == strlen(enders[k]) && agree(s->held, s->n_held, enders[k])) {
                s->n_held = 0;
                return close_body(s, emit, arg);
            }
            prefix |= s->n_held < strlen(enders[k]) && agree(s->held, s->n_held, enders[k]);
        }
        if (prefix)
            return 0;
        /* the first byte begins no ender: out, and the rest looked at again */
        size_t k = 1;
        while (k < s->n_held && s->held[k] != '<')
            k++;
        if (give(s, s->held, k, emit, arg) < 0)
            return -1;
        memmove(s->held, s->held + k, s->n_held - k);
        s->n_held -= k;
    }
    return 0;
}

/* One more header byte: the body opens after "<|message|>"; a header that cannot be one
 * turns the reply to raw content, the header's bytes first. */
static int header_byte(harmony_split *s, char c, harmony_emit emit, void *arg)
{
    bool opening = false, started = false;
    if (s->n_header == HARMONY_HEADER_MAX) {
        s->state = HARMONY_RAW;
        return emit(arg, false, s->header, s->n_header) < 0 ? -1 : emit(arg, false, &c, 1);
    }
    s->header[s->n_header++] = c;
    for (size_t k = 0; k < N_OPENINGS; k++) {
        opening |= agree(s->header, s->n_header, openings[k]);
        started |= s->n_header >= strlen(openings[k]) && agree(s->header, s->n_header, openings[k]);
    }
    if (!opening) {
        s->state = HARMONY_RAW;
        return emit(arg, false, s->header, s->n_header);
    }
    size_t m = strlen(MESSAGE);
    if (started && s->n_header >= m && memcmp(s->header + s->n_header - m, MESSAGE, m) == 0) {
        open_body(s);
        if (s->body == HARMONY_CALL)
            return emit(arg, false, s->call_open, strlen(s->call_open));
    }
    return 0;
}

int harmony_feed(harmony_split *s, const char *text, size_t n, bool end, harmony_emit emit,
                 void *arg)
{
    size_t run = 0; /* text[run..p) is body or raw content not given yet */
    s->fed += n;
    for (size_t p = 0; p < n; p++) {
        char c = text[p];
        if (s->state == HARMONY_RAW)
            continue;
        if (s->state == HARMONY_HEADER) {
            if (header_byte(s, c, emit, arg) < 0)
                return -1;
            run = p + 1;
            continue;
        }
        if (s->n_held == 0 && c != '<')
            continue;
        if (give(s, text + run, p - run, emit, arg) < 0)
            return -1;
        s->held[s->n_held++] = c;
        if (settle(s, emit, arg) < 0)
            return -1;
        run = p + 1;
    }
    if (s->state == HARMONY_RAW)
        return n > run ? emit(arg, false, text + run, n - run) : 0;
    if (s->state == HARMONY_BODY && give(s, text + run, n - run, emit, arg) < 0)
        return -1;
    if (!end || s->state != HARMONY_BODY)
        return 0;
    /* the reply is over: held bytes are the body's, and the body ends with it (an unread
     * header is markup, dropped) */
    size_t held = s->n_held;
    s->n_held = 0;
    if (give(s, s->held, held, emit, arg) < 0)
        return -1;
    return close_body(s, emit, arg);
}
