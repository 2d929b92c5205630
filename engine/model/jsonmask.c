/* jsonmask.c — the JSON recogniser and the token table (see jsonmask.h). */
#include "engine/model/jsonmask.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* What the next byte may be. */
enum mode {
    M_START,      /* before the top-level value: whitespace, '{' (or '[' if the schema's) */
    M_VALUE,      /* a value (after ':', or ',' in an array) */
    M_OBJ_FIRST,  /* after '{': a key or '}' */
    M_OBJ_KEY,    /* after ',' in an object: a key */
    M_KEY,        /* inside a closed object's key: matching its properties' names */
    M_COLON,      /* after a key: ':' */
    M_ARR_FIRST,  /* after '[': a value or ']' */
    M_AFTER,      /* after a value in a container: ',' or its closer */
    M_STRING,     /* inside a string (s->key: a free object's key) */
    M_ESCAPE,     /* after '\' */
    M_HEX,        /* count hex digits of \uXXXX to come */
    M_UTF8,       /* count continuation bytes to come, the next in [utf8_lo, utf8_hi] */
    M_LITERAL,    /* spelling literals[literal], its letter count next */
    M_ENUM,       /* spelling one of an enum's values */
    M_MINUS,      /* after a number's '-': a digit */
    M_ZERO,       /* a number's integer part is 0: '.', 'e' or its end */
    M_INT,        /* in the integer part's digits */
    M_DOT,        /* after '.': a digit */
    M_FRAC,       /* in the fraction's digits */
    M_EXP,        /* after 'e': a sign or a digit */
    M_EXP_SIGN,   /* after the exponent's sign: a digit */
    M_EXP_DIGITS, /* in the exponent's digits */
    M_DONE,       /* the top-level value is complete: nothing more */
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

void jsonmask_init_schema(jsonmask_state *s, const jsonschema *schema)
{
    memset(s, 0, sizeof *s);
    s->schema = schema;
    s->node = schema->root;
    s->mode = M_START;
}

void jsonmask_init(jsonmask_state *s)
{
    jsonmask_init_schema(s, jsonschema_any_object());
}

bool jsonmask_complete(const jsonmask_state *s)
{
    return s->mode == M_DONE;
}

static const jsonschema_node *node_at(const jsonmask_state *s, uint16_t id)
{
    return &s->schema->nodes[id];
}

/* The automaton of patterned string node n. */
static const regex_dfa *pattern_of(const jsonmask_state *s, const jsonschema_node *n)
{
    return s->schema->patterns[n->pattern - 1];
}

static bool in_array(const jsonmask_state *s)
{
    return (s->stack >> (s->depth - 1)) & 1u;
}

static jsonmask_frame *top(jsonmask_state *s)
{
    return &s->frame[s->depth - 1];
}

/* The tag of a tagged union's object is whole (an enum value: the first spelling of
 * s->cand): the object goes on as the alternative that has that value, after its tag. */
static void tag_chosen(jsonmask_state *s)
{
    const jsonschema *sc = s->schema;
    jsonmask_frame *f = top(s);
    const jsonschema_node *u = node_at(s, node_at(s, f->node)->items);
    jsonschema_text got = sc->spellings[(uint32_t)s->cand];
    for (uint16_t i = 0; i < u->n; i++) {
        uint16_t alt = sc->alts[u->first + i];
        const jsonschema_node *tag = node_at(s, sc->props[node_at(s, alt)->first].value);
        for (uint16_t k = 0; k < tag->n; k++)
            if (jsonschema_texts_equal(sc, sc->spellings[tag->first + k], got)) {
                f->node = alt;
                f->next = 1;
                return;
            }
    }
}

/* A value ended: the container it is in takes ',' or its closer next (an array counts
 * it; a tag head turns into the alternative its tag names); the top-level value itself
 * ending completes the text. */
static void value_done(jsonmask_state *s)
{
    if (s->depth == 0) {
        s->mode = M_DONE;
        return;
    }
    if (in_array(s) && top(s)->next < JSONSCHEMA_COUNT_MAX)
        top(s)->next++;
    else if (s->mode == M_ENUM && !in_array(s) && node_at(s, top(s)->node)->tag_head)
        tag_chosen(s);
    s->mode = M_AFTER;
}

/* The node of item i of array node n: a tuple's own, then `items`. */
static uint16_t item_node(const jsonmask_state *s, const jsonschema_node *n, uint16_t i)
{
    return i < n->n_prefix ? s->schema->alts[n->prefix + i] : n->items;
}

static bool open_container(jsonmask_state *s, bool array)
{
    if (s->depth == JSONMASK_DEPTH_MAX)
        return false;
    s->stack = array ? s->stack | (1u << s->depth) : s->stack & ~(1u << s->depth);
    s->frame[s->depth] = (jsonmask_frame){s->node, 0};
    s->depth++;
    s->mode = array ? M_ARR_FIRST : M_OBJ_FIRST;
    if (array)
        s->node = item_node(s, node_at(s, s->node), 0);
    return true;
}

/* The required properties of a closed object from index `next` on, as bits. */
static uint64_t required_from(const jsonschema_node *n, uint16_t next)
{
    return next >= 64 ? 0 : n->required >> next;
}

/* The closer c of the innermost container, where the schema lets it close: an array
 * with its minItems, an object with its required properties. */
static bool close_container(jsonmask_state *s, uint8_t c)
{
    const jsonmask_frame *f = top(s);
    const jsonschema_node *n = node_at(s, f->node);
    if (in_array(s) ? c != ']' || f->next < n->min_items
                    : c != '}' || (!n->free_object && required_from(n, f->next)))
        return false;
    s->depth--;
    value_done(s);
    return true;
}

/* The properties a closed object's next key may name: from `next` on, up to and with
 * the first required one (keys come in the order of the schema's properties). */
static uint64_t key_candidates(const jsonschema_node *n, uint16_t next)
{
    if (next >= n->n)
        return 0;
    uint64_t all = n->n == 64 ? ~0ull : (1ull << n->n) - 1;
    uint64_t from = all & (~0ull << next);
    uint64_t req = n->required & from;
    uint64_t upto = req ? ((req & -req) << 1) - 1 : ~0ull;
    return from & upto;
}

/* The '"' that opens a key, in the innermost object. */
static bool key_start(jsonmask_state *s)
{
    const jsonmask_frame *f = top(s);
    const jsonschema_node *n = node_at(s, f->node);
    if (n->free_object) {
        s->mode = M_STRING;
        s->key = true;
        s->counted = false;
        s->patterned = false;
        return true;
    }
    s->cand = key_candidates(n, f->next);
    s->pos = 0;
    s->mode = M_KEY;
    return s->cand != 0;
}

/* A byte of a closed object's key: the candidates whose names go on with it; '"' ends
 * the key if one is spelled whole, and the value of that property comes next. A '"'
 * that a name goes on with is escaped (names are spelled as json-c writes them, so all
 * candidates, sharing the bytes so far, agree on it). */
static bool key_byte(jsonmask_state *s, uint8_t c)
{
    const jsonschema *sc = s->schema;
    const jsonschema_node *n = node_at(s, top(s)->node);
    uint64_t goes_on = 0, whole = 0;
    for (uint64_t cand = s->cand; cand; cand &= cand - 1) {
        int i = __builtin_ctzll(cand);
        const jsonschema_prop *p = &sc->props[n->first + (uint32_t)i];
        if (p->name.len > s->pos && jsonschema_bytes(sc, p->name)[s->pos] == c)
            goes_on |= 1ull << i;
        else if (p->name.len == s->pos)
            whole = 1ull << i;
    }
    if (goes_on) {
        s->cand = goes_on;
        s->pos++;
        return true;
    }
    if (c != '"' || !whole)
        return false;
    int i = __builtin_ctzll(whole);
    top(s)->next = (uint16_t)(i + 1);
    s->node = sc->props[n->first + (uint32_t)i].value;
    s->mode = M_COLON;
    return true;
}

/* The enum spellings still matching: [*lo, *hi) of the schema's spellings. */
static void enum_range(const jsonmask_state *s, uint32_t *lo, uint32_t *hi)
{
    *lo = (uint32_t)s->cand;
    *hi = (uint32_t)(s->cand >> 32);
}

/* Whether one of the matching spellings is spelled whole. Sorted bytewise, it is the
 * first of the range. */
static bool enum_whole(const jsonmask_state *s)
{
    uint32_t lo, hi;
    enum_range(s, &lo, &hi);
    return s->schema->spellings[lo].len == s->pos;
}

/* Narrows the matching spellings to those that go on with c: a run of the sorted range. */
static bool enum_narrow(jsonmask_state *s, uint8_t c)
{
    const jsonschema *sc = s->schema;
    const jsonschema_text *sp = sc->spellings;
    uint32_t lo, hi, pos = s->pos;
    enum_range(s, &lo, &hi);
    uint32_t a = lo;
    while (a < hi && (sp[a].len <= pos || jsonschema_bytes(sc, sp[a])[pos] < c))
        a++;
    uint32_t z = a;
    while (z < hi && sp[z].len > pos && jsonschema_bytes(sc, sp[z])[pos] == c)
        z++;
    if (a == z)
        return false;
    s->cand = (uint64_t)z << 32 | a;
    s->pos++;
    if (z == a + 1 && sp[a].len == s->pos)
        value_done(s); /* one spelling left and it is whole: nothing else can follow */
    return true;
}

static bool step(jsonmask_state *s, uint8_t c);

/* A byte after an enum's value began: one that goes on with a spelling, or the first
 * byte after a value spelled whole (as after a number). */
static bool enum_byte(jsonmask_state *s, uint8_t c)
{
    if (enum_narrow(s, c))
        return true;
    if (!enum_whole(s))
        return false;
    value_done(s);
    if (is_ws(c)) {
        s->ws_run = 1;
        return true;
    }
    return step(s, c);
}

/* The kind a value's first byte shows (integer and number alike); 0 for none. */
static uint8_t kind_of_first_byte(uint8_t c)
{
    switch (c) {
    case '{':
        return JSONSCHEMA_OBJECT;
    case '[':
        return JSONSCHEMA_ARRAY;
    case '"':
        return JSONSCHEMA_STRING;
    case 't':
    case 'f':
        return JSONSCHEMA_BOOLEAN;
    case 'n':
        return JSONSCHEMA_NULL;
    default:
        return c == '-' || is_digit(c) ? JSONSCHEMA_NUMBER | JSONSCHEMA_INTEGER : 0;
    }
}

/* The node a value starting with c is read by: the expected node, or the alternative
 * of a union that takes values of c's kind. false if the node takes no such value. */
static bool node_for_first_byte(const jsonmask_state *s, uint8_t c, uint16_t *id)
{
    uint8_t kind = kind_of_first_byte(c);
    const jsonschema_node *n = node_at(s, *id);
    while (n->kinds & kind) {
        if (n->shape != JSONSCHEMA_UNION)
            return true;
        const uint16_t *alt = s->schema->alts + n->first;
        uint16_t i = 0;
        while (i < n->n && !(node_at(s, alt[i])->kinds & kind))
            i++;
        *id = alt[i]; /* one of them takes the kind: the union's kinds are theirs */
        n = node_at(s, *id);
    }
    return false;
}

static bool int_bounded(const jsonschema_node *n)
{
    return n->has_min || n->has_max;
}

/* |v| of v <= 0, without overflow at INT64_MIN. */
static uint64_t magnitude_of_nonpositive(int64_t v)
{
    return (uint64_t)(-(v + 1)) + 1;
}

/* The magnitudes [*lo, *hi] a bounded integer of that sign may have. false: none. A
 * minus sign takes 1 at least: -0 is no bounded integer's spelling. */
static bool magnitude_range(const jsonschema_node *n, bool neg, uint64_t *lo, uint64_t *hi)
{
    if (!neg) {
        if (n->max < 0)
            return false;
        *lo = n->min > 0 ? (uint64_t)n->min : 0;
        *hi = (uint64_t)n->max;
    } else {
        if (n->min >= 0)
            return false;
        *lo = n->max < 0 ? magnitude_of_nonpositive(n->max) : 1;
        *hi = magnitude_of_nonpositive(n->min);
    }
    return *lo <= *hi;
}

/* Whether the integer read so far (s->neg, s->num) can still end within the node's
 * bounds: as it is (whole), or with more digits after it (a leading 0 takes none).
 * Appending k digits to m gives [m 10^k, m 10^k + 10^k - 1]. */
static bool int_reachable(const jsonmask_state *s, const jsonschema_node *n, bool whole)
{
    uint64_t lo, hi, a = s->num, span = 1;
    if (!magnitude_range(n, s->neg, &lo, &hi))
        return false;
    for (;;) {
        if (a <= hi && (a >= lo || span - 1 >= lo - a))
            return true;
        if (whole || a == 0 || a > hi / 10 || span > UINT64_MAX / 10)
            return false;
        a *= 10;
        span *= 10;
    }
}

/* A digit of a number's integer part (its first too), for a bounded integer's check. */
static bool int_digit(jsonmask_state *s, uint8_t c)
{
    const jsonschema_node *n = node_at(s, s->node);
    if (!int_bounded(n))
        return true;
    uint64_t d = (uint64_t)(c - '0');
    if (s->num > (UINT64_MAX - d) / 10)
        return false;
    s->num = s->num * 10 + d;
    return int_reachable(s, n, false);
}

static bool num_bounded(const jsonschema_node *n)
{
    return n->has_nmin || n->has_nmax;
}

/* An interval of reals, each end in it or not. */
typedef struct span {
    double lo, hi;
    bool lo_in, hi_in;
} span;

static bool spans_meet(span a, span b)
{
    double lo = a.lo > b.lo ? a.lo : b.lo, hi = a.hi < b.hi ? a.hi : b.hi;
    bool lo_in = a.lo > b.lo ? a.lo_in : a.lo < b.lo ? b.lo_in : a.lo_in && b.lo_in;
    bool hi_in = a.hi < b.hi ? a.hi_in : a.hi > b.hi ? b.hi_in : a.hi_in && b.hi_in;
    return lo < hi || (lo == hi && lo_in && hi_in);
}

static span bounds_of(const jsonschema_node *n)
{
    return (span){n->has_nmin ? n->nmin : -INFINITY, n->has_nmax ? n->nmax : INFINITY,
                  !n->nmin_excl, !n->nmax_excl};
}

/* Whether magnitudes in [a, b) (b_in: b too), with the number's sign, meet n's bounds.
 * Where doubles cannot tell b from a (16 digits and more), the span is the point a: the
 * spelling's value then rounds to it. */
static bool magnitudes_meet(const jsonschema_node *n, bool neg, double a, double b, bool b_in)
{
    if (!(b > a)) {
        b = a;
        b_in = true;
    }
    span values = neg ? (span){-b, -a, b_in, true} : (span){a, b, true, b_in};
    return spans_meet(values, bounds_of(n));
}

/* Whether the bounded number spelled so far (s->num_text: a sign, digits, a point, digits;
 * no exponent) can still end within n's bounds, in at most JSONSCHEMA_NUMBER_CHARS
 * characters (whole: as it is). Digits d appended to an integer part p give [p 10^k,
 * (p + 1) 10^k) for k more digits (a fraction may follow); after the point with m
 * digits, x to x + 10^-m. */
static bool num_reachable(const jsonmask_state *s, const jsonschema_node *n, bool whole)
{
    char text[JSONSCHEMA_NUMBER_CHARS + 1];
    memcpy(text, s->num_text, s->num_len);
    text[s->num_len] = '\0';
    bool neg = text[0] == '-';
    const char *digits = text + neg;
    if (!digits[0]) /* only the sign: a value below 0 (a bound at 0 takes no "-0") */
        return spans_meet((span){-INFINITY, 0, false, false}, bounds_of(n));
    double x = strtod(digits, NULL);
    if (whole)
        return magnitudes_meet(n, neg, x, x, true);
    const char *dot = strchr(digits, '.');
    if (dot) {
        int m = (int)strlen(dot + 1);
        return magnitudes_meet(n, neg, x, x + pow(10, -m), false);
    }
    if (digits[0] == '0') /* a leading 0 takes a fraction only */
        return magnitudes_meet(n, neg, 0, 1, false);
    int room = JSONSCHEMA_NUMBER_CHARS - s->num_len;
    for (int k = 0; k <= room; k++) {
        double scale = pow(10, k);
        if (magnitudes_meet(n, neg, x * scale, (x + 1) * scale, false))
            return true;
    }
    return false;
}

/* A byte of a number (sign, digit, point) that a bounded number keeps and checks. */
static bool num_byte(jsonmask_state *s, uint8_t c)
{
    const jsonschema_node *n = node_at(s, s->node);
    if (!num_bounded(n))
        return true;
    /* a sign or a point must leave room for a digit after it */
    if (s->num_len + (c == '-' || c == '.' ? 2 : 1) > JSONSCHEMA_NUMBER_CHARS)
        return false;
    s->num_text[s->num_len++] = (char)c;
    return num_reachable(s, n, false);
}

/* Whether the number being read may take a fraction (or, unbounded, an exponent). */
static bool fraction_allowed(const jsonmask_state *s, uint8_t c)
{
    const jsonschema_node *n = node_at(s, s->node);
    return (n->kinds & JSONSCHEMA_NUMBER) && (c == '.' || !num_bounded(n));
}

/* The first byte of a value (the top-level '{' or '[' included), read by s->node. */
static bool value_start(jsonmask_state *s, uint8_t c)
{
    uint16_t id = s->node;
    if (s->depth > 0 && in_array(s) &&
        top(s)->next >= node_at(s, top(s)->node)->max_items)
        return false; /* maxItems reached: no other item */
    if (!node_for_first_byte(s, c, &id))
        return false;
    s->node = id;
    const jsonschema_node *n = node_at(s, id);
    if (n->shape == JSONSCHEMA_ENUM) {
        s->mode = M_ENUM;
        s->cand = (uint64_t)(n->first + n->n) << 32 | n->first;
        s->pos = 0;
        return enum_narrow(s, c);
    }
    if (n->shape == JSONSCHEMA_TAGGED)
        s->node = n->items; /* its tag head until the tag is read */
    switch (c) {
    case '{':
        return open_container(s, false);
    case '[':
        return open_container(s, true);
    case '"':
        s->mode = M_STRING;
        s->key = false;
        s->counted = n->min_length > 0 || n->max_length != UINT32_MAX;
        s->str_len = 0;
        s->patterned = n->pattern != 0;
        if (s->patterned)
            s->re = regex_start(pattern_of(s, n));
        return true;
    case '-': {
        s->mode = M_MINUS;
        s->neg = true;
        s->num = 0;
        s->num_len = 0;
        uint64_t lo, hi;
        return (!int_bounded(n) || magnitude_range(n, true, &lo, &hi)) && num_byte(s, c);
    }
    case 't':
    case 'f':
    case 'n':
        s->mode = M_LITERAL;
        s->literal = c == 't' ? 0 : c == 'f' ? 1 : 2;
        s->count = 1;
        return true;
    default:
        s->mode = c == '0' ? M_ZERO : M_INT;
        s->neg = false;
        s->num = 0;
        s->num_len = 0;
        return int_digit(s, c) && num_byte(s, c);
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

/* The escapes a string takes after '\', and the bytes they stand for (a patterned string
 * is written without \u, so these are all it has). */
static const char escapes[] = "\"\\/bfnrt", escaped_bytes[] = "\"\\/\b\f\n\r\t";

/* Whether a patterned string's automaton takes any escape's byte now: else a '\' would
 * lead nowhere. */
static bool escape_allowed(const jsonmask_state *s)
{
    const regex_dfa *dfa = pattern_of(s, node_at(s, s->node));
    for (const char *e = escaped_bytes; *e; e++)
        if (regex_step(dfa, s->re, (uint8_t)*e) != REGEX_DEAD)
            return true;
    return false;
}

/* The decoded byte c of a string's text: a patterned string's automaton steps on it. */
static bool pattern_byte(jsonmask_state *s, uint8_t c)
{
    if (!s->patterned)
        return true;
    s->re = regex_step(pattern_of(s, node_at(s, s->node)), s->re, c);
    return s->re != REGEX_DEAD;
}

/* A byte inside a string, after its opening quote. A length-bounded string counts a
 * character at its first byte ('\' of an escape, a UTF-8 lead byte). */
static bool string_step(jsonmask_state *s, uint8_t c)
{
    if (c == '"') {
        if (s->key) {
            s->mode = M_COLON;
            s->node = node_at(s, top(s)->node)->items;
            return true;
        }
        if (s->counted && s->str_len < node_at(s, s->node)->min_length)
            return false;
        if (s->patterned && !regex_accepts(pattern_of(s, node_at(s, s->node)), s->re))
            return false;
        value_done(s);
        return true;
    }
    if (s->counted) {
        if (s->str_len >= node_at(s, s->node)->max_length)
            return false;
        s->str_len++;
    }
    if (c == '\\') {
        s->mode = M_ESCAPE;
        return !s->patterned || escape_allowed(s);
    }
    return pattern_byte(s, c) && string_byte(s, c);
}

/* A number ended at c, which is then the byte after the value. */
static bool number_end(jsonmask_state *s, uint8_t c)
{
    const jsonschema_node *n = node_at(s, s->node);
    if ((int_bounded(n) && !int_reachable(s, n, true)) ||
        (num_bounded(n) && !num_reachable(s, n, true)))
        return false;
    value_done(s); /* numbers are never the top-level value: a container takes c */
    if (is_ws(c)) {
        s->ws_run = 1;
        return true;
    }
    return step(s, c);
}

static bool step(jsonmask_state *s, uint8_t c)
{
    switch ((enum mode)s->mode) {
    case M_START:
        return (c == '{' || c == '[') && value_start(s, c);
    case M_VALUE:
        return value_start(s, c);
    case M_OBJ_FIRST:
    case M_OBJ_KEY:
        if (c == '}' && s->mode == M_OBJ_FIRST)
            return close_container(s, c);
        return c == '"' && key_start(s);
    case M_KEY:
        return key_byte(s, c);
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
        if (c != ',')
            return close_container(s, c);
        if (in_array(s)) {
            s->mode = M_VALUE;
            s->node = item_node(s, node_at(s, top(s)->node), top(s)->next);
            return top(s)->next < node_at(s, top(s)->node)->max_items;
        }
        s->mode = M_OBJ_KEY;
        return node_at(s, top(s)->node)->free_object ||
               top(s)->next < node_at(s, top(s)->node)->n;
    case M_STRING:
        return string_step(s, c);
    case M_ESCAPE: {
        if (c == 'u' && !s->patterned) {
            s->mode = M_HEX;
            s->count = 4;
            return true;
        }
        const char *e = c ? strchr(escapes, c) : NULL;
        if (!e)
            return false;
        s->mode = M_STRING;
        return pattern_byte(s, (uint8_t)escaped_bytes[e - escapes]);
    }
    case M_HEX:
        if (!is_hex(c))
            return false;
        if (--s->count == 0)
            s->mode = M_STRING;
        return true;
    case M_UTF8:
        if (c < s->utf8_lo || c > s->utf8_hi || !pattern_byte(s, c))
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
    case M_ENUM:
        return enum_byte(s, c);
    case M_MINUS:
        if (!is_digit(c))
            return false;
        s->mode = c == '0' ? M_ZERO : M_INT;
        return int_digit(s, c) && num_byte(s, c);
    case M_ZERO:
    case M_INT:
        if (is_digit(c) && s->mode == M_INT)
            return int_digit(s, c) && num_byte(s, c);
        if (c == '.' || c == 'e' || c == 'E') {
            s->mode = c == '.' ? M_DOT : M_EXP;
            return fraction_allowed(s, c) && (c != '.' || num_byte(s, c));
        }
        return number_end(s, c);
    case M_DOT:
        if (!is_digit(c))
            return false;
        s->mode = M_FRAC;
        return num_byte(s, c);
    case M_FRAC:
        if (is_digit(c))
            return num_byte(s, c);
        if (c == 'e' || c == 'E') {
            s->mode = M_EXP;
            return fraction_allowed(s, c);
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

/* Whitespace where structure may have it: bounded runs. Strings, keys and the middle of
 * a number, literal or enum value take none here (a number ends at one: number_end). */
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
    tok_pieces pieces; /* every token's bytes */
    uint8_t *flags;    /* (n_vocab) TOKEN_* bits */
    uint8_t *key;      /* (n_vocab) the byte a token is first tested by: its first, or
                          after leading whitespace (TOKEN_WS_LED) its second */
    uint16_t *chars;   /* (n_vocab) a TOKEN_STRING_PLAIN token's characters (to 65535) */
};

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

/* The characters of whole UTF-8 text: its bytes that are no continuation byte. */
static uint16_t utf8_chars(const uint8_t *b, uint32_t n)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++)
        k += (b[i] & 0xc0) != 0x80;
    return k > UINT16_MAX ? UINT16_MAX : (uint16_t)k;
}

int jsonmask_vocab_new(const tokenizer *t, jsonmask_vocab **out, char err[ERR_MAX])
{
    int32_t n = tok_n_vocab(t);
    jsonmask_vocab *v = calloc(1, sizeof *v);
    *out = NULL;
    if (!v || !(v->flags = calloc((size_t)n ? (size_t)n : 1, 1)) ||
        !(v->key = calloc((size_t)n ? (size_t)n : 1, 1)) ||
        !(v->chars = calloc((size_t)n ? (size_t)n : 1, sizeof *v->chars))) {
        jsonmask_vocab_free(v);
        return err_set(err, "jsonmask: out of memory for a vocabulary of %d tokens", (int)n);
    }
    if (tok_pieces_new(t, &v->pieces, err)) {
        jsonmask_vocab_free(v);
        return -1;
    }
    v->n_vocab = n;
    for (int32_t i = 0; i < n; i++) {
        uint32_t len = v->pieces.start[i + 1] - v->pieces.start[i];
        const uint8_t *b = v->pieces.bytes + v->pieces.start[i];
        bool ws_led = len > 1 && is_ws(b[0]);
        v->key[i] = len ? b[ws_led] : 0;
        bool plain = string_plain(b, len);
        v->flags[i] = (uint8_t)((ws_led ? TOKEN_WS_LED : 0) | (tok_is_eog(t, i) ? TOKEN_EOG : 0) |
                                (plain ? TOKEN_STRING_PLAIN : 0) | (len ? 0 : TOKEN_NO_BYTES));
        v->chars[i] = plain ? utf8_chars(b, len) : 0;
    }
    *out = v;
    return 0;
}

void jsonmask_vocab_free(jsonmask_vocab *v)
{
    if (!v)
        return;
    tok_pieces_free(&v->pieces);
    free(v->flags);
    free(v->key);
    free(v->chars);
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
    const jsonmask_state *st = &c->state;
    c->string_room = st->mode == M_STRING && st->counted
                         ? node_at(st, st->node)->max_length - st->str_len
                         : UINT32_MAX;
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

void jsonmask_cursor_init_schema(jsonmask_cursor *c, const jsonmask_vocab *v,
                                 const jsonschema *schema)
{
    c->vocab = v;
    jsonmask_init_schema(&c->state, schema);
    cursor_prepare(c);
}

void jsonmask_cursor_init(jsonmask_cursor *c, const jsonmask_vocab *v)
{
    jsonmask_cursor_init_schema(c, v, jsonschema_any_object());
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
    /* inside a string most tokens are plain text, which leaves the state as it is (but
     * for the count of a length-bounded string's characters, or a patterned string's
     * automaton) */
    if (c->state.mode == M_STRING && (f & TOKEN_STRING_PLAIN)) {
        if (!c->state.patterned)
            return v->chars[token] <= c->string_room;
        /* a patterned string's automaton alone tells (its lengths are in it) */
        const regex_dfa *dfa = pattern_of(&c->state, node_at(&c->state, c->state.node));
        uint16_t re = c->state.re;
        for (uint32_t i = v->pieces.start[token]; i < v->pieces.start[token + 1] && re != REGEX_DEAD; i++)
            re = regex_step(dfa, re, v->pieces.bytes[i]);
        return re != REGEX_DEAD;
    }
    uint32_t from = v->pieces.start[token];
    jsonmask_state s = c->state;
    return jsonmask_feed(&s, v->pieces.bytes + from, v->pieces.start[token + 1] - from);
}

int jsonmask_take(jsonmask_cursor *c, int32_t token)
{
    if (!jsonmask_allows(c, token))
        return -1;
    const jsonmask_vocab *v = c->vocab;
    uint32_t from = v->pieces.start[token], len = v->pieces.start[token + 1] - from;
    jsonmask_feed(&c->state, v->pieces.bytes + from, len); /* allowed: it takes every byte */
    cursor_prepare(c);
    return 0;
}
