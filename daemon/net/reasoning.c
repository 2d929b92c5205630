/* reasoning.c — a reply's reasoning told apart from its content (reasoning.h). */
#include "daemon/net/reasoning.h"

#include <stdlib.h>
#include <string.h>

/* The close marker, with the line break before it that goes with it. */
#define CLOSE_NL "\n" REASONING_CLOSE

void reasoning_init(reasoning_split *s, bool opened)
{
    memset(s, 0, sizeof *s);
    s->state = opened ? REASONING_LEAD : REASONING_AT_START;
}

void reasoning_start(reasoning_split *s, enum chat_think kind, bool calls)
{
    reasoning_init(s, kind == CHAT_THINK_OPENED);
    if (kind == CHAT_THINK_REPLY_SPACED)
        s->state = REASONING_AT_SPACE;
    if ((s->harmony = kind == CHAT_THINK_HARMONY))
        harmony_init(&s->h, calls);
}

size_t reasoning_fed(const reasoning_split *s)
{
    return s->harmony ? s->h.fed : s->fed;
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/*
 * One feed reads the bytes held back before it (copied to s->out) and then the piece, as
 * one run V: position p < n_out is s->out[p], the others the piece's p - n_out.
 */
typedef struct run {
    reasoning_split *s;
    const char *text;
    size_t n_out, len;
    reasoning_span *spans;
    int n_spans;
} run;

static char at(const run *r, size_t p)
{
    return p < r->n_out ? r->s->out[p] : r->text[p - r->n_out];
}

/* V[a..b) as a span or two (the held bytes' part, the piece's part). */
static void give(run *r, bool reasoning, size_t a, size_t b)
{
    if (a < r->n_out && a < b) {
        size_t e = b < r->n_out ? b : r->n_out;
        r->spans[r->n_spans++] = (reasoning_span){reasoning, r->s->out + a, e - a};
        a = e;
    }
    if (a < b)
        r->spans[r->n_spans++] = (reasoning_span){reasoning, r->text + (a - r->n_out), b - a};
}

/* Whether V[a..b) begins marker (is a prefix of it, the whole of it included). */
static bool begins(const run *r, size_t a, size_t b, const char *marker)
{
    size_t m = strlen(marker);
    if (b - a > m)
        return false;
    for (size_t p = a; p < b; p++)
        if (at(r, p) != marker[p - a])
            return false;
    return true;
}

static bool is_marker(const run *r, size_t a, size_t b, const char *marker)
{
    return b - a == strlen(marker) && begins(r, a, b, marker);
}

/* Whether V[a..b) may still grow into the close marker (a proper prefix of it, with or
 * without the line break). */
static bool may_close(const run *r, size_t a, size_t b)
{
    return (b - a < strlen(CLOSE_NL) && begins(r, a, b, CLOSE_NL)) ||
           (b - a < strlen(REASONING_CLOSE) && begins(r, a, b, REASONING_CLOSE));
}

int reasoning_feed(reasoning_split *s, const char *text, size_t n, bool end,
                   reasoning_span *spans)
{
    memcpy(s->out, s->held, s->n_held);
    run r = {s, text, s->n_held, s->n_held + n, spans, 0};
    s->n_held = 0;
    s->fed += n;
    /* V[from..held) is decided and not given yet, V[held..p) held back */
    size_t from = 0, held = 0;
    for (size_t p = 0; p < r.len; p++) {
        char c = at(&r, p);
        switch (s->state) {
        case REASONING_AT_SPACE:
            if (is_space(c)) {
                from = held = p + 1;
                continue;
            }
            /* the block may open at c */
            s->state = REASONING_AT_START;
            /* fall through */
        case REASONING_AT_START:
            /* V[from..p]: what may open it (from is 0 but after dropped white space) */
            if (!begins(&r, from, p + 1, REASONING_OPEN)) {
                s->state = REASONING_CONTENT;
                break;
            }
            if (p + 1 - from == strlen(REASONING_OPEN)) {
                s->state = REASONING_LEAD;
                from = held = p + 1;
            }
            continue;
        case REASONING_LEAD:
        case REASONING_AFTER:
            if (is_space(c)) {
                from = held = p + 1;
                continue;
            }
            s->state = s->state == REASONING_LEAD ? REASONING_IN : REASONING_CONTENT;
            break;
        default:
            break;
        }
        if (s->state == REASONING_CONTENT)
            break;
        /* REASONING_IN: V[held..p] the bytes that may be the close marker */
        if (is_marker(&r, held, p + 1, REASONING_CLOSE) || is_marker(&r, held, p + 1, CLOSE_NL)) {
            give(&r, true, from, held);
            s->state = REASONING_AFTER;
            from = held = p + 1;
            continue;
        }
        while (held <= p && !may_close(&r, held, p + 1))
            held++;
    }
    if (s->state == REASONING_CONTENT) {
        give(&r, false, from, r.len);
        return r.n_spans;
    }
    if (end) {
        /* a block never closed is reasoning to the end; a reply that only began as
         * "<think>" is content (white space alone: nothing) */
        give(&r, s->state != REASONING_AT_START && s->state != REASONING_AT_SPACE, from, r.len);
        return r.n_spans;
    }
    give(&r, true, from, held);
    for (size_t p = held; p < r.len; p++)
        s->held[s->n_held++] = at(&r, p);
    return r.n_spans;
}

void reasoning_split_text(enum chat_think kind, const char *text, size_t n,
                          reasoning_span *reasoning, reasoning_span *content)
{
    reasoning_split s;
    reasoning_span spans[REASONING_SPANS];
    reasoning_start(&s, kind, false);
    int k = reasoning_feed(&s, text, n, true, spans);
    *reasoning = (reasoning_span){true, text, 0};
    *content = (reasoning_span){false, text, 0};
    /* nothing was held before: each kind is one run of text */
    for (int i = 0; i < k; i++)
        *(spans[i].reasoning ? reasoning : content) = spans[i];
}

int reasoning_feed_each(reasoning_split *s, const char *text, size_t n, bool end,
                        harmony_emit emit, void *arg)
{
    if (s->harmony)
        return harmony_feed(&s->h, text, n, end, emit, arg);
    reasoning_span spans[REASONING_SPANS];
    int k = reasoning_feed(s, text, n, end, spans);
    for (int i = 0; i < k; i++)
        if (emit(arg, spans[i].reasoning, spans[i].text, spans[i].n) < 0)
            return -1;
    return 0;
}

/* A whole reply's reasoning and content, measured (buf NULL) or written after each
 * other into buf. */
typedef struct whole {
    char *buf;
    size_t n[2]; /* bytes of content [0] and reasoning [1] so far */
    size_t at_reasoning;
} whole;

static int whole_put(void *arg, bool reasoning, const char *text, size_t n)
{
    whole *w = arg;
    if (w->buf)
        memcpy(w->buf + (reasoning ? w->n[1] : w->at_reasoning + w->n[0]), text, n);
    w->n[reasoning] += n;
    return 0;
}

int reasoning_split_harmony(const char *text, size_t n, bool calls, char **owned,
                            reasoning_span *reasoning, reasoning_span *content)
{
    harmony_split h;
    whole w = {0};
    harmony_init(&h, calls);
    harmony_feed(&h, text, n, true, whole_put, &w);
    /* the reasoning first, then the content */
    w = (whole){malloc(w.n[0] + w.n[1] + 1), {0, 0}, w.n[1]};
    if (!w.buf)
        return -1;
    harmony_init(&h, calls);
    harmony_feed(&h, text, n, true, whole_put, &w);
    w.buf[w.n[1] + w.n[0]] = '\0';
    *owned = w.buf;
    *reasoning = (reasoning_span){true, w.buf, w.n[1]};
    *content = (reasoning_span){false, w.buf + w.n[1], w.n[0]};
    return 0;
}
