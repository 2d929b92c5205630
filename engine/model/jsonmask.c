/* jsonmask.c — the JSON recogniser and the token table (see jsonmask.h). */
#include "engine/model/jsonmask.h"

#include <stdlib.h>
#include <string.h>

/* What the next byte may be. */
enum mode {
    M_START,      /* before the object: whitespace or '{' */
    M_VALUE,      /* a value (after ':', or ',' in an array) */
    M_OBJ_FIRST,  /* after '{': a key or '}' */
    M_OBJ_KEY,    /* after ',' in an object: a key */
    M_COLON,      /* after a key: ':' */
    M_ARR_FIRST,  /* after '[': a value or ']' */
    M_AFTER,      /* after a value in a container: ',' or its closer */
    M_STRING,     /* inside a string (s->key: a key's) */
    M_ESCAPE,     /* after '\' */
    M_HEX,        /* count hex digits of \uXXXX to come */
    M_UTF8,       /* count continuation bytes to come, the next in [utf8_lo, utf8_hi] */
    M_LITERAL,    /* spelling literals[literal], its letter count next */
    M_MINUS,      /* after a number's '-': a digit */
    M_ZERO,       /* a number's integer part is 0: '.', 'e' or its end */
    M_INT,        /* in the integer part's digits */
    M_DOT,        /* after '.': a digit */
    M_FRAC,       /* in the fraction's digits */
    M_EXP,        /* after 'e': a sign or a digit */
    M_EXP_SIGN,   /* after the exponent's sign: a digit */
    M_EXP_DIGITS, /* in the exponent's digits */
    M_DONE,       /* the object is complete: nothing more */
};

static const char *const literals[] = {"true", "false", "null"};

static bool is_ws(uint8_t c)
{
    return (c == ' ') | (c == '\t') | (c == '\n') | (c == '\r');
}

static bool is_digit(uint8_t c)
{
    return c >= '0' && c <= '9';
}

static bool is_hex(uint8_t c)
{
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

void jsonmask_init(jsonmask_state *s)
{
    memset(s, 0, sizeof *s);
    s->mode = M_START;
}

bool jsonmask_complete(const jsonmask_state *s)
{
    return s->mode == M_DONE;
}

static bool in_array(const jsonmask_state *s)
{
    return (s->stack >> (s->depth - 1)) & 1u;
}

/* A value ended: the container it is in takes ',' or its closer next; the object itself
 * ending completes the text. */
static void value_done(jsonmask_state *s)
{
    s->mode = s->depth == 0 ? M_DONE : M_AFTER;
}

static bool open_container(jsonmask_state *s, bool array)
{
    if (s->depth == JSONMASK_DEPTH_MAX)
        return false;
    s->stack = array ? s->stack | (1u << s->depth) : s->stack & ~(1u << s->depth);
    s->depth++;
    s->mode = array ? M_ARR_FIRST : M_OBJ_FIRST;
    return true;
}

static bool close_container(jsonmask_state *s, uint8_t c)
{
    if (c != (in_array(s) ? ']' : '}'))
        return false;
    s->depth--;
    value_done(s);
    return true;
}

/* The first byte of a value (the object's own '{' included). */
static bool value_start(jsonmask_state *s, uint8_t c)
{
    switch (c) {
    case '{':
        return open_container(s, false);
    case '[':
        return open_container(s, true);
    case '"':
        s->mode = M_STRING;
        s->key = false;
        return true;
    case '-':
        s->mode = M_MINUS;
        return true;
    case '0':
        s->mode = M_ZERO;
        return true;
    case 't':
    case 'f':
    case 'n':
        s->mode = M_LITERAL;
        s->literal = c == 't' ? 0 : c == 'f' ? 1 : 2;
        s->count = 1;
        return true;
    default:
        if (c >= '1' && c <= '9') {
            s->mode = M_INT;
            return true;
        }
        return false;
    }
}

/* A byte of a string's content (not '"' or '\'): a character of UTF-8 or its start. */
static bool string_byte(jsonmask_state *s, uint8_t c)
{
    if (c < 0x20)
        return false; /* control characters only escaped */
    if (c < 0x80)
        return true;
    uint8_t lo = 0x80, hi = 0xbf, more;
    if (c >= 0xc2 && c <= 0xdf) {
        more = 1;
    } else if (c >= 0xe0 && c <= 0xef) {
        more = 2;
        if (c == 0xe0)
            lo = 0xa0; /* overlong below */
        else if (c == 0xed)
            hi = 0x9f; /* surrogates above */
    } else if (c >= 0xf0 && c <= 0xf4) {
        more = 3;
        if (c == 0xf0)
            lo = 0x90;
        else if (c == 0xf4)
            hi = 0x8f; /* past U+10FFFF above */
    } else {
        return false; /* a continuation byte, C0, C1 (overlong) or F5-FF */
    }
    s->mode = M_UTF8;
    s->count = more;
    s->utf8_lo = lo;
    s->utf8_hi = hi;
    return true;
}

/* A number ended at c, which is then the byte after the value. */
static bool number_end(jsonmask_state *s, uint8_t c);

static bool step(jsonmask_state *s, uint8_t c)
{
    switch ((enum mode)s->mode) {
    case M_START:
        return c == '{' && open_container(s, false);
    case M_VALUE:
        return value_start(s, c);
    case M_OBJ_FIRST:
    case M_OBJ_KEY:
        if (c == '}' && s->mode == M_OBJ_FIRST)
            return close_container(s, c);
        if (c != '"')
            return false;
        s->mode = M_STRING;
        s->key = true;
        return true;
    case M_COLON:
        if (c != ':')
            return false;
        s->mode = M_VALUE;
        return true;
    case M_ARR_FIRST:
        if (c == ']')
            return close_container(s, c);
        return value_start(s, c);
    case M_AFTER:
        if (c == ',') {
            s->mode = in_array(s) ? M_VALUE : M_OBJ_KEY;
            return true;
        }
        return close_container(s, c);
    case M_STRING:
        if (c == '"') {
            if (s->key)
                s->mode = M_COLON;
            else
                value_done(s);
            return true;
        }
        if (c == '\\') {
            s->mode = M_ESCAPE;
            return true;
        }
        return string_byte(s, c);
    case M_ESCAPE:
        if (c == 'u') {
            s->mode = M_HEX;
            s->count = 4;
            return true;
        }
        if (!strchr("\"\\/bfnrt", c) || c == '\0')
            return false;
        s->mode = M_STRING;
        return true;
    case M_HEX:
        if (!is_hex(c))
            return false;
        if (--s->count == 0)
            s->mode = M_STRING;
        return true;
    case M_UTF8:
        if (c < s->utf8_lo || c > s->utf8_hi)
            return false;
        s->utf8_lo = 0x80;
        s->utf8_hi = 0xbf;
        if (--s->count == 0)
            s->mode = M_STRING;
        return true;
    case M_LITERAL: {
        const char *lit = literals[s->literal];
        if (c != (uint8_t)lit[s->count])
            return false;
        if (lit[++s->count] == '\0')
            value_done(s);
        return true;
    }
    case M_MINUS:
        if (c == '0') {
            s->mode = M_ZERO;
            return true;
        }
        if (c >= '1' && c <= '9') {
            s->mode = M_INT;
            return true;
        }
        return false;
    case M_ZERO:
    case M_INT:
        if (is_digit(c) && s->mode == M_INT)
            return true;
        if (c == '.') {
            s->mode = M_DOT;
            return true;
        }
        if (c == 'e' || c == 'E') {
            s->mode = M_EXP;
            return true;
        }
        return number_end(s, c);
    case M_DOT:
        if (!is_digit(c))
            return false;
        s->mode = M_FRAC;
        return true;
    case M_FRAC:
        if (is_digit(c))
            return true;
        if (c == 'e' || c == 'E') {
            s->mode = M_EXP;
            return true;
        }
        return number_end(s, c);
    case M_EXP:
    case M_EXP_SIGN:
        if ((c == '+' || c == '-') && s->mode == M_EXP) {
            s->mode = M_EXP_SIGN;
            return true;
        }
        if (!is_digit(c))
            return false;
        s->mode = M_EXP_DIGITS;
        return true;
    case M_EXP_DIGITS:
        if (is_digit(c))
            return true;
        return number_end(s, c);
    case M_DONE:
        return false;
    }
    return false;
}

static bool number_end(jsonmask_state *s, uint8_t c)
{
    /* numbers are never the top-level value: a container takes the byte after one */
    s->mode = M_AFTER;
    if (is_ws(c)) {
        s->ws_run = 1;
        return true;
    }
    return step(s, c);
}

/* Whitespace where structure may have it: bounded runs. Strings and the middle of a
 * number or literal take none here (a number ends at one: number_end). */
static bool ws_allowed(const jsonmask_state *s)
{
    switch ((enum mode)s->mode) {
    case M_START:
    case M_VALUE:
    case M_OBJ_FIRST:
    case M_OBJ_KEY:
    case M_COLON:
    case M_ARR_FIRST:
    case M_AFTER:
        return true;
    default:
        return false;
    }
}

static bool feed_byte(jsonmask_state *s, uint8_t c)
{
    if (is_ws(c) && ws_allowed(s))
        return ++s->ws_run <= JSONMASK_WS_MAX;
    s->ws_run = 0;
    return step(s, c);
}

bool jsonmask_feed(jsonmask_state *s, const void *bytes, size_t n)
{
    const uint8_t *b = bytes;
    for (size_t i = 0; i < n; i++)
        if (!feed_byte(s, b[i]))
            return false;
    return true;
}

/* ---- tokens ---- */

/* Token flags. */
enum {
    TOKEN_WS_LED = 1,       /* a whitespace byte, then more: its key byte is the second */
    TOKEN_EOG = 2,          /* ends generation: allowed once the object is complete */
    TOKEN_STRING_PLAIN = 4, /* bytes that leave a string's content state as it was: no '"',
                               '\', control byte, and whole UTF-8 characters */
    TOKEN_NO_BYTES = 8,     /* stands for no bytes (control, unknown, unused, end of
                               generation) */
};

struct jsonmask_vocab {
    int32_t n_vocab;
    uint32_t *start;  /* (n_vocab + 1) token i's bytes are bytes[start[i], start[i + 1]) */
    uint8_t *bytes;   /* (start[n_vocab] + 1) every token's bytes, back to back */
    uint8_t *flags;   /* (n_vocab) TOKEN_* bits */
    uint8_t *key;     /* (n_vocab) the byte a token is first tested by: its first, or
                         after leading whitespace (TOKEN_WS_LED) its second */
};

/* Whether a token stands for bytes of a reply: control, unknown and unused tokens are
 * markup, and an end-of-generation token ends the reply whatever its type. */
static bool has_text(const tokenizer *t, int32_t id)
{
    enum tok_type type = tok_type(t, id);
    return (type == TOK_TYPE_NORMAL || type == TOK_TYPE_BYTE || type == TOK_TYPE_USER_DEFINED) &&
           !tok_is_eog(t, id);
}

static bool string_plain(const uint8_t *b, uint32_t n)
{
    jsonmask_state s;
    jsonmask_init(&s);
    s.mode = M_STRING;
    for (uint32_t i = 0; i < n; i++)
        if (b[i] == '"' || b[i] == '\\' || !step(&s, b[i]))
            return false;
    return n > 0 && s.mode == M_STRING;
}

int jsonmask_vocab_new(const tokenizer *t, jsonmask_vocab **out, char err[ERR_MAX])
{
    int32_t n = tok_n_vocab(t);
    jsonmask_vocab *v = calloc(1, sizeof *v);
    *out = NULL;
    if (!v || !(v->start = malloc(sizeof *v->start * ((size_t)n + 1))) ||
        !(v->flags = calloc((size_t)n ? (size_t)n : 1, 1)) ||
        !(v->key = calloc((size_t)n ? (size_t)n : 1, 1))) {
        jsonmask_vocab_free(v);
        return err_set(err, "jsonmask: out of memory for a vocabulary of %d tokens", (int)n);
    }
    v->n_vocab = n;
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        v->start[i] = (uint32_t)total;
        int len = has_text(t, i) ? tok_piece(t, i, NULL, 0) : 0;
        total += len > 0 ? (size_t)len : 0;
        if (total > UINT32_MAX) {
            jsonmask_vocab_free(v);
            return err_set(err, "jsonmask: the vocabulary's pieces pass 4 GiB");
        }
    }
    v->start[n] = (uint32_t)total;
    /* tok_piece writes a NUL after the piece: one byte more at the end */
    if (!(v->bytes = malloc(total + 1))) {
        jsonmask_vocab_free(v);
        return err_set(err, "jsonmask: out of memory for %zu bytes of pieces", total);
    }
    for (int32_t i = 0; i < n; i++) {
        uint32_t len = v->start[i + 1] - v->start[i];
        const uint8_t *b = v->bytes + v->start[i];
        if (len)
            tok_piece(t, i, (char *)v->bytes + v->start[i], (size_t)len + 1);
        bool ws_led = len > 1 && is_ws(b[0]);
        v->key[i] = len ? b[ws_led] : 0;
        v->flags[i] = (uint8_t)((ws_led ? TOKEN_WS_LED : 0) | (tok_is_eog(t, i) ? TOKEN_EOG : 0) |
                                (string_plain(b, len) ? TOKEN_STRING_PLAIN : 0) |
                                (len ? 0 : TOKEN_NO_BYTES));
    }
    *out = v;
    return 0;
}

void jsonmask_vocab_free(jsonmask_vocab *v)
{
    if (!v)
        return;
    free(v->start);
    free(v->bytes);
    free(v->flags);
    free(v->key);
    free(v);
}

int32_t jsonmask_vocab_size(const jsonmask_vocab *v)
{
    return v->n_vocab;
}

static bool bit_set(const uint64_t *bits, uint8_t b)
{
    return (bits[b >> 6] >> (b & 63)) & 1;
}

/* The bytes the cursor's state takes next, and after a space: 512 trial steps, once per
 * token taken, so that most tokens are refused by their first byte or, when that is a
 * space, their second. Whichever whitespace byte the state takes leaves it as a space
 * does (structure counts the run alike, a number ends alike, a string takes only the
 * space), so the space stands for all four. */
static void cursor_prepare(jsonmask_cursor *c)
{
    memset(c->next_ok, 0, sizeof c->next_ok);
    jsonmask_state after_ws = c->state;
    bool ws_ok = feed_byte(&after_ws, ' ');
    for (int b = 0; b < 256; b++) {
        jsonmask_state s = c->state;
        if (feed_byte(&s, (uint8_t)b))
            c->next_ok[0][b >> 6] |= 1ull << (b & 63);
        s = after_ws;
        if (ws_ok && feed_byte(&s, (uint8_t)b))
            c->next_ok[1][b >> 6] |= 1ull << (b & 63);
    }
}

void jsonmask_cursor_init(jsonmask_cursor *c, const jsonmask_vocab *v)
{
    c->vocab = v;
    jsonmask_init(&c->state);
    cursor_prepare(c);
}

bool jsonmask_allows(const jsonmask_cursor *c, int32_t token)
{
    const jsonmask_vocab *v = c->vocab;
    if (token < 0 || token >= v->n_vocab)
        return false;
    unsigned f = v->flags[token];
    if (f & TOKEN_NO_BYTES)
        return (f & TOKEN_EOG) && jsonmask_complete(&c->state);
    /* Most tokens are refused here by one bit, found from two bytes per token (key,
     * flags) without a branch on the token's kind, whose outcome would vary from token
     * to token (mispredicted, such a branch doubled the time of a pass over a
     * vocabulary). A token that passes may still be refused by its other bytes. */
    if (!bit_set(c->next_ok[f & TOKEN_WS_LED], v->key[token]))
        return false;
    /* inside a string most tokens are plain text, which leaves the state as it is */
    if (c->state.mode == M_STRING && (f & TOKEN_STRING_PLAIN))
        return true;
    uint32_t from = v->start[token];
    jsonmask_state s = c->state;
    return jsonmask_feed(&s, v->bytes + from, v->start[token + 1] - from);
}

int jsonmask_take(jsonmask_cursor *c, int32_t token)
{
    if (!jsonmask_allows(c, token))
        return -1;
    const jsonmask_vocab *v = c->vocab;
    uint32_t from = v->start[token], len = v->start[token + 1] - from;
    jsonmask_feed(&c->state, v->bytes + from, len); /* allowed: it takes every byte */
    cursor_prepare(c);
    return 0;
}
