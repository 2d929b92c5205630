/* stop.c — holding back text that may begin a stop string (see stop.h). */
#include "engine/tok/stop.h"

#include <string.h>

int stop_init(stop_matcher *m, const char *const *strings, int n, char err[ERR_MAX])
{
    if (n < 0 || n > STOP_MAX)
        return err_set(err, "stop: %d stop strings given, at most %d supported", n, STOP_MAX);
    if (n > 0 && !strings)
        return err_set(err, "stop: no stop strings given");
    for (int i = 0; i < n; i++) {
        size_t len = strings[i] ? strlen(strings[i]) : 0;
        if (len == 0)
            return err_set(err, "stop: stop string %d is empty", i);
        if (len > STOP_MAX_LEN)
            return err_set(err, "stop: stop string %d is %zu bytes, at most %d supported", i,
                           len, STOP_MAX_LEN);
    }
    memset(m, 0, sizeof *m);
    m->n = n;
    for (int i = 0; i < n; i++) {
        m->len[i] = strlen(strings[i]);
        memcpy(m->str[i], strings[i], m->len[i]);
    }
    m->hit = -1;
    return 0;
}

void stop_reset(stop_matcher *m)
{
    m->n_held = 0;
    m->hit = -1;
}

int stop_hit(const stop_matcher *m)
{
    return m->hit;
}

size_t stop_hit_text(const stop_matcher *m, char out[STOP_MAX_LEN + 1])
{
    size_t n = m->hit >= 0 ? m->len[m->hit] : 0;
    if (n)
        memcpy(out, m->str[m->hit], n);
    out[n] = '\0';
    return n;
}

/* Byte i of the virtual text "held bytes, then the piece". */
static char at(const stop_matcher *m, const char *piece, size_t i)
{
    return i < m->n_held ? m->held[i] : piece[i - m->n_held];
}

static bool matches_at(const stop_matcher *m, const char *piece, size_t start, size_t total,
                       int k)
{
    if (m->len[k] > total - start)
        return false;
    for (size_t j = 0; j < m->len[k]; j++)
        if (at(m, piece, start + j) != m->str[k][j])
            return false;
    return true;
}

/* Whether the last t bytes of the text equal the first t bytes of stop string k. */
static bool tail_is_prefix(const stop_matcher *m, const char *piece, size_t total, size_t t,
                           int k)
{
    for (size_t j = 0; j < t; j++)
        if (at(m, piece, total - t + j) != m->str[k][j])
            return false;
    return true;
}

/* Length of the longest tail of the text that is a proper prefix of a stop string. */
static size_t partial_tail(const stop_matcher *m, const char *piece, size_t total)
{
    size_t best = 0;
    for (int k = 0; k < m->n; k++) {
        size_t t = m->len[k] - 1 < total ? m->len[k] - 1 : total;
        for (; t > best; t--)
            if (tail_is_prefix(m, piece, total, t, k)) {
                best = t;
                break;
            }
    }
    return best;
}

/* Length of an incomplete UTF-8 character at the end of the text (0..3), so that
 * emitted text never ends inside a character split across token pieces. */
static size_t incomplete_utf8_tail(const stop_matcher *m, const char *piece, size_t total)
{
    for (size_t back = 1; back <= 4 && back <= total; back++) {
        unsigned char c = (unsigned char)at(m, piece, total - back);
        if ((c & 0xC0) == 0x80)
            continue; /* continuation byte: the lead is further back */
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back && c < 0xF8 ? back : 0;
    }
    return 0;
}

static void copy_text(const stop_matcher *m, const char *piece, size_t from, size_t to,
                      char *dst)
{
    for (size_t i = from; i < to; i++)
        *dst++ = at(m, piece, i);
}

long stop_feed(stop_matcher *m, const char *piece, size_t len, char *out, size_t cap)
{
    if (m->hit >= 0)
        return 0;
    if (cap < m->n_held + len)
        return -1;
    size_t total = m->n_held + len;

    /* The earliest complete stop string wins; what precedes it is the last output. */
    for (size_t start = 0; start < total; start++)
        for (int k = 0; k < m->n; k++)
            if (matches_at(m, piece, start, total, k)) {
                copy_text(m, piece, 0, start, out);
                m->hit = k;
                m->n_held = 0;
                return (long)start;
            }

    size_t hold = partial_tail(m, piece, total);
    size_t split_char = incomplete_utf8_tail(m, piece, total);
    if (split_char > hold)
        hold = split_char;
    size_t emit = total - hold;
    copy_text(m, piece, 0, emit, out);
    /* The new tail may start inside the old one, so shift before appending the piece. */
    size_t from_held = emit < m->n_held ? m->n_held - emit : 0;
    memmove(m->held, m->held + (m->n_held - from_held), from_held);
    if (hold > from_held)
        memcpy(m->held + from_held, piece + (len - (hold - from_held)), hold - from_held);
    m->n_held = hold;
    return (long)emit;
}

size_t stop_flush(stop_matcher *m, char *out)
{
    size_t n = m->n_held;
    memcpy(out, m->held, n);
    m->n_held = 0;
    return n;
}
