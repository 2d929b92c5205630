/* regex.c — a JSON Schema pattern compiled into a byte automaton (see regex.h).
 *
 * The route: the pattern is parsed into a tree whose leaves are sets of characters; the
 * tree becomes an NFA over bytes (Thompson's, built from the end backwards; a set becomes
 * the UTF-8 byte ranges of its characters, split as RE2 splits them); subset construction
 * makes it deterministic over classes of bytes; Hopcroft's algorithm minimises it; a count
 * of characters is multiplied in for the lengths; minimising again also trims (every state
 * that reaches no accepting one falls into the dead one); and the bytes that no state
 * tells apart share a column of the final table.
 */
#include "engine/model/regex.h"

#include <stdlib.h>
#include <string.h>

#include "engine/arraygrow.h"
#include "engine/tok/utf8.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#define CP_MAX 0x10FFFFu
/* The longest pattern taken: its tree takes some 32 bytes a byte before any other bound
 * (the NFA's) is met. */
#define PATTERN_MAX (1u << 18)
/* Groups nested deeper are refused: the parser and the NFA's construction recurse on them. */
#define DEPTH_MAX 100
/* A repeat's upper count that means none. */
#define UNBOUNDED 0xFFFFu
/* NFA states once repeats are expanded (12 bytes each). */
#define NFA_MAX (1u << 18)
/* The subset construction's memory (NFA states held in the subsets of all its states; its
 * work is bounded by REGEX_WORK_MAX): an unanchored pattern's subsets hold every place a
 * match may have started, which some patterns make large. */
#define HELD_MAX (1u << 21)
/* Slots of the open-addressed tables of automaton states: at most half full. */
#define HASH_SLOTS (2 * REGEX_STATES_MAX)

typedef struct range {
    uint32_t lo, hi;
} range;

static const range any_char[] = {{0, CP_MAX}};
static const range digit_chars[] = {{'0', '9'}};
static const range word_chars[] = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
/* ECMA-262's WhiteSpace and LineTerminator. */
static const range space_chars[] = {
    {0x09, 0x0D}, {0x20, 0x20}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
    {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF},
};
/* What '.' does not take. */
static const range line_ends[] = {{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}};
/* What a JSON string's writer may put there raw: \b \t \n \f \r, no other control, and no
 * surrogate (no UTF-8 holds one). */
static const range writable[] = {{0x08, 0x0A}, {0x0C, 0x0D}, {0x20, 0xD7FF}, {0xE000, CP_MAX}};

static int oom(char *err)
{
    return err_set(err, "pattern: out of memory");
}

/* ---- parsing: the pattern into a tree ---- */

enum { NODE_SET, NODE_CAT, NODE_ALT, NODE_REPEAT };

typedef struct node {
    uint8_t kind;
    uint16_t min, max; /* NODE_REPEAT: its counts (max UNBOUNDED: no upper one) */
    uint32_t first, n; /* NODE_SET: ranges[first..+n), sorted and disjoint; NODE_CAT and
                          NODE_ALT: kids[first..+n); NODE_REPEAT: first is what repeats */
} node;

/* One of the pattern's top-level alternatives, with its anchors. */
typedef struct branch {
    uint32_t node;
    bool start, end;
} branch;

typedef struct tree {
    node *nodes;
    uint32_t n_nodes, cap_nodes;
    range *ranges;
    uint32_t n_ranges, cap_ranges;
    uint32_t *kids;
    uint32_t n_kids, cap_kids;
    branch *branches;
    uint32_t n_branches, cap_branches;
} tree;

typedef struct parser {
    const uint8_t *s;
    size_t len, pos;
    int depth;
    tree *t;
    uint32_t *stack; /* the terms and alternatives of the groups open at pos */
    uint32_t n_stack, cap_stack;
    range *set;      /* the set being read, in any order */
    uint32_t n_set, cap_set;
    char *err;
} parser;

static bool is_digit(uint8_t c)
{
    return c >= '0' && c <= '9';
}

static bool is_letter(uint8_t c)
{
    return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
}

static int hex_value(uint8_t c)
{
    return is_digit(c) ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10
                                                                          : -1;
}

/* The value of n hex digits at s[pos], or false when there are not n there. */
static bool hex_digits(const parser *p, size_t pos, int n, uint32_t *v)
{
    *v = 0;
    for (int i = 0; i < n; i++) {
        int h = pos + i < p->len ? hex_value(p->s[pos + i]) : -1;
        if (h < 0)
            return false;
        *v = *v << 4 | (uint32_t)h;
    }
    return true;
}

/* The character encoded at p->pos (moving past it), or -1 if the bytes there are not
 * UTF-8 (utf8_seq's: overlong forms and surrogates included). */
static int32_t utf8_next(parser *p)
{
    const uint8_t *s = p->s + p->pos;
    int k = utf8_seq((const char *)s, p->len - p->pos);
    if (k <= 0)
        return -1;
    uint32_t cp = k == 1 ? s[0] : s[0] & (0x7Fu >> k);
    for (int i = 1; i < k; i++)
        cp = cp << 6 | (s[i] & 0x3Fu);
    p->pos += (size_t)k;
    return (int32_t)cp;
}

static int add_range(parser *p, uint32_t lo, uint32_t hi)
{
    if (arraygrow((void **)&p->set, &p->cap_set, p->n_set, sizeof *p->set, 1))
        return oom(p->err);
    p->set[p->n_set++] = (range){lo, hi};
    return 0;
}

/* Adds the n sorted ranges r to the set being read, or with negate, the characters
 * outside them. */
static int add_ranges(parser *p, const range *r, size_t n, bool negate)
{
    uint32_t from = 0;
    for (size_t i = 0; i < n; i++) {
        if (!negate && add_range(p, r[i].lo, r[i].hi))
            return -1;
        if (negate && r[i].lo > from && add_range(p, from, r[i].lo - 1))
            return -1;
        from = r[i].hi + 1;
    }
    return negate && from <= CP_MAX ? add_range(p, from, CP_MAX) : 0;
}

static int new_node(parser *p, node n, uint32_t *id)
{
    tree *t = p->t;
    if (arraygrow((void **)&t->nodes, &t->cap_nodes, t->n_nodes, sizeof *t->nodes, 1))
        return oom(p->err);
    *id = t->n_nodes;
    t->nodes[t->n_nodes++] = n;
    return 0;
}

static int range_order(const void *a, const void *b)
{
    uint32_t x = ((const range *)a)->lo, y = ((const range *)b)->lo;
    return (x > y) - (x < y);
}

/* The set read so far (then emptied) as a node, sorted and merged; with negate, the
 * characters outside it. */
static int finish_set(parser *p, bool negate, uint32_t *id)
{
    tree *t = p->t;
    uint32_t n = 0;
    if (p->n_set)
        qsort(p->set, p->n_set, sizeof *p->set, range_order);
    for (uint32_t i = 0; i < p->n_set; i++) {
        if (n && p->set[i].lo <= p->set[n - 1].hi + 1) {
            if (p->set[i].hi > p->set[n - 1].hi)
                p->set[n - 1].hi = p->set[i].hi;
        } else {
            p->set[n++] = p->set[i];
        }
    }
    p->n_set = 0;
    if (arraygrow((void **)&t->ranges, &t->cap_ranges, t->n_ranges, sizeof *t->ranges, n + 1))
        return oom(p->err);
    uint32_t first = t->n_ranges, from = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!negate)
            t->ranges[t->n_ranges++] = p->set[i];
        else if (p->set[i].lo > from)
            t->ranges[t->n_ranges++] = (range){from, p->set[i].lo - 1};
        from = p->set[i].hi + 1;
    }
    if (negate && from <= CP_MAX)
        t->ranges[t->n_ranges++] = (range){from, CP_MAX};
    return new_node(p, (node){.kind = NODE_SET, .first = first, .n = t->n_ranges - first}, id);
}

static int push(parser *p, uint32_t id)
{
    if (arraygrow((void **)&p->stack, &p->cap_stack, p->n_stack, sizeof *p->stack, 1))
        return oom(p->err);
    p->stack[p->n_stack++] = id;
    return 0;
}

/* The nodes pushed since base (then popped) as one node of kind: the node itself when it
 * is one. */
static int finish_list(parser *p, uint8_t kind, uint32_t base, uint32_t *id)
{
    tree *t = p->t;
    uint32_t n = p->n_stack - base;
    p->n_stack = base;
    if (n == 1) {
        *id = p->stack[base];
        return 0;
    }
    if (arraygrow((void **)&t->kids, &t->cap_kids, t->n_kids, sizeof *t->kids, n))
        return oom(p->err);
    if (n)
        memcpy(t->kids + t->n_kids, p->stack + base, n * sizeof *t->kids);
    t->n_kids += n;
    return new_node(p, (node){.kind = kind, .first = t->n_kids - n, .n = n}, id);
}

/* \uHHHH (p->pos past the u): a surrogate pair written as two is one character. */
static int parse_u(parser *p, size_t at, uint32_t *cp)
{
    uint32_t v, low;
    if (p->pos < p->len && p->s[p->pos] == '{')
        return err_set(p->err, "pattern: code point escape '\\u{' at byte %zu is not supported",
                       at);
    if (!hex_digits(p, p->pos, 4, &v))
        return err_set(p->err, "pattern: '\\u' at byte %zu needs four hex digits", at);
    p->pos += 4;
    if (v >= 0xD800 && v <= 0xDBFF && p->pos + 1 < p->len && p->s[p->pos] == '\\' &&
        p->s[p->pos + 1] == 'u' && hex_digits(p, p->pos + 2, 4, &low) && low >= 0xDC00 &&
        low <= 0xDFFF) {
        p->pos += 6;
        *cp = 0x10000 + ((v - 0xD800) << 10) + (low - 0xDC00);
        return 0;
    }
    if (v >= 0xD800 && v <= 0xDFFF)
        return err_set(p->err, "pattern: lone surrogate '\\u%04X' at byte %zu: no UTF-8 string "
                               "holds it", v, at);
    *cp = v;
    return 0;
}

/* The escape at p->pos: one character (*cp; returns 0), or a class of them added to the
 * set being read (returns 1). */
static int parse_escape(parser *p, bool in_class, uint32_t *cp)
{
    size_t at = p->pos;
    if (at + 1 >= p->len)
        return err_set(p->err, "pattern: '\\' at byte %zu ends the pattern", at);
    uint8_t c = p->s[at + 1];
    p->pos = at + 2;
    switch (c) {
    case 'd':
    case 'D':
        return add_ranges(p, digit_chars, ARRAY_LEN(digit_chars), c == 'D') ? -1 : 1;
    case 'w':
    case 'W':
        return add_ranges(p, word_chars, ARRAY_LEN(word_chars), c == 'W') ? -1 : 1;
    case 's':
    case 'S':
        return add_ranges(p, space_chars, ARRAY_LEN(space_chars), c == 'S') ? -1 : 1;
    case 't':
        *cp = '\t';
        return 0;
    case 'n':
        *cp = '\n';
        return 0;
    case 'v':
        *cp = '\v';
        return 0;
    case 'f':
        *cp = '\f';
        return 0;
    case 'r':
        *cp = '\r';
        return 0;
    case 'b':
        if (in_class) {
            *cp = '\b';
            return 0;
        }
        return err_set(p->err, "pattern: word boundary '\\b' at byte %zu is not supported", at);
    case 'B':
        return err_set(p->err, "pattern: non-word boundary '\\B' at byte %zu is not supported",
                       at);
    case '0':
        if (p->pos < p->len && is_digit(p->s[p->pos]))
            return err_set(p->err, "pattern: escape '\\0' followed by a digit at byte %zu (an "
                                   "octal escape) is not supported", at);
        *cp = 0;
        return 0;
    case 'k':
        return err_set(p->err, "pattern: backreference '\\k' at byte %zu is not supported", at);
    case 'p':
    case 'P':
        return err_set(p->err, "pattern: Unicode property '\\%c' at byte %zu is not supported",
                       c, at);
    case 'c':
        if (p->pos < p->len && is_letter(p->s[p->pos])) {
            *cp = p->s[p->pos++] % 32u;
            return 0;
        }
        return err_set(p->err, "pattern: '\\c' at byte %zu needs a letter", at);
    case 'x':
        if (hex_digits(p, p->pos, 2, cp)) {
            p->pos += 2;
            return 0;
        }
        return err_set(p->err, "pattern: '\\x' at byte %zu needs two hex digits", at);
    case 'u':
        return parse_u(p, at, cp);
    }
    if (is_digit(c) && !in_class)
        return err_set(p->err, "pattern: backreference '\\%c' at byte %zu is not supported", c,
                       at);
    if (c >= 0x80)
        return err_set(p->err, "pattern: escape of a non-ASCII character at byte %zu is not "
                               "supported", at);
    if (c < 0x20 || c == 0x7F)
        return err_set(p->err, "pattern: escape of a control character at byte %zu is not "
                               "supported", at);
    if (is_digit(c) || is_letter(c))
        return err_set(p->err, "pattern: escape '\\%c' at byte %zu is not supported", c, at);
    *cp = c; /* ASCII punctuation or space, escaped or not, is itself */
    return 0;
}

/* A repeat count at pos ({n}, {n,} or {n,m}): its length in bytes, 0 when the bytes there
 * are none. A count past REGEX_REPEAT_MAX reads as REGEX_REPEAT_MAX + 1; no upper count
 * as UINT32_MAX. */
static uint32_t read_count(const parser *p, size_t *i)
{
    uint32_t v = 0;
    while (*i < p->len && is_digit(p->s[*i])) {
        v = v * 10 + (uint32_t)(p->s[(*i)++] - '0');
        if (v > REGEX_REPEAT_MAX)
            v = REGEX_REPEAT_MAX + 1;
    }
    return v;
}

static size_t braces(const parser *p, size_t pos, uint32_t *min, uint32_t *max)
{
    size_t i = pos + 1, from = i;
    *min = *max = read_count(p, &i);
    if (i == from)
        return 0;
    if (i < p->len && p->s[i] == ',') {
        from = ++i;
        *max = read_count(p, &i);
        if (i == from)
            *max = UINT32_MAX;
    }
    return i < p->len && p->s[i] == '}' ? i + 1 - pos : 0;
}

static bool repeat_at(const parser *p, size_t pos)
{
    uint32_t min, max;
    uint8_t c = p->s[pos];
    return c == '*' || c == '+' || c == '?' || (c == '{' && braces(p, pos, &min, &max));
}

/* A repeat after the atom *id, if there is one: *id becomes the repeat's node. */
static int parse_repeat(parser *p, uint32_t *id)
{
    size_t at = p->pos;
    if (at >= p->len)
        return 0;
    uint32_t min = 0, max = UINT32_MAX;
    uint8_t c = p->s[at];
    if (c == '*' || c == '+' || c == '?') {
        min = c == '+';
        max = c == '?' ? 1 : UINT32_MAX;
        p->pos++;
    } else if (c == '{') {
        size_t n = braces(p, at, &min, &max);
        if (!n)
            return err_set(p->err, "pattern: '{' at byte %zu starts no repeat count (write \\{ "
                                   "for the character)", at);
        if (min > REGEX_REPEAT_MAX || (max != UINT32_MAX && max > REGEX_REPEAT_MAX))
            return err_set(p->err, "pattern: repeat count above %d at byte %zu",
                           REGEX_REPEAT_MAX, at);
        if (min > max)
            return err_set(p->err, "pattern: repeat {%u,%u} at byte %zu has its minimum above "
                                   "its maximum", min, max, at);
        p->pos += n;
    } else {
        return 0;
    }
    if (p->pos < p->len && p->s[p->pos] == '?')
        p->pos++; /* lazy: the same strings match */
    if (p->pos < p->len && repeat_at(p, p->pos))
        return err_set(p->err, "pattern: '%c' at byte %zu repeats nothing", p->s[p->pos],
                       p->pos);
    return new_node(p, (node){.kind = NODE_REPEAT, .first = *id, .min = (uint16_t)min,
                              .max = max == UINT32_MAX ? UNBOUNDED : (uint16_t)max}, id);
}

static int parse_disjunction(parser *p, bool top, uint32_t *id);

/* "(?" at p->pos - 1 (p->pos at the '?'): a group that only groups (moves past its head)
 * or a refusal naming what it is. */
static int parse_group_head(parser *p, size_t at)
{
    const uint8_t *s = p->s;
    size_t i = p->pos + 1;
    uint8_t c = i < p->len ? s[i] : 0, d = i + 1 < p->len ? s[i + 1] : 0;
    const char *what = c == '=' ? "lookahead '(?='" : c == '!' ? "negative lookahead '(?!'"
                       : c == '<' && d == '=' ? "lookbehind '(?<='"
                       : c == '<' && d == '!' ? "negative lookbehind '(?<!'" : NULL;
    if (what)
        return err_set(p->err, "pattern: %s at byte %zu is not supported", what, at);
    if (c == ':') {
        p->pos = i + 1;
        return 0;
    }
    if (c != '<') {
        if (c > 0x20 && c < 0x7F)
            return err_set(p->err, "pattern: group '(?%c' at byte %zu is not supported", c, at);
        return err_set(p->err, "pattern: group '(?' at byte %zu is not supported", at);
    }
    /* (?<name>: a name as ECMA-262's ASCII identifiers are written; captures do not
     * change what matches */
    size_t name = ++i;
    while (i < p->len && (is_letter(s[i]) || s[i] == '_' || s[i] == '$' ||
                          (i > name && is_digit(s[i]))))
        i++;
    if (i == name || i >= p->len || s[i] != '>')
        return err_set(p->err, "pattern: invalid group name at byte %zu", name);
    p->pos = i + 1;
    return 0;
}

static int parse_group(parser *p, uint32_t *id)
{
    size_t at = p->pos++;
    if (p->depth == DEPTH_MAX)
        return err_set(p->err, "pattern: groups nested deeper than %d at byte %zu", DEPTH_MAX,
                       at);
    if (p->pos < p->len && p->s[p->pos] == '?' && parse_group_head(p, at))
        return -1;
    p->depth++;
    int rc = parse_disjunction(p, false, id);
    p->depth--;
    if (rc)
        return -1;
    if (p->pos >= p->len)
        return err_set(p->err, "pattern: '(' at byte %zu is not closed", at);
    p->pos++;
    return 0;
}

/* A character of a class, or a class escape (returns 1, its set added). */
static int parse_class_atom(parser *p, uint32_t *cp)
{
    if (p->s[p->pos] == '\\')
        return parse_escape(p, true, cp);
    size_t at = p->pos;
    int32_t c = utf8_next(p);
    if (c < 0)
        return err_set(p->err, "pattern: invalid UTF-8 at byte %zu", at);
    *cp = (uint32_t)c;
    return 0;
}

static int parse_class(parser *p, uint32_t *id)
{
    size_t open = p->pos++;
    bool negate = p->pos < p->len && p->s[p->pos] == '^';
    p->pos += negate;
    for (;;) {
        if (p->pos >= p->len)
            return err_set(p->err, "pattern: '[' at byte %zu is not closed", open);
        if (p->s[p->pos] == ']')
            break;
        size_t at = p->pos;
        uint32_t lo, hi;
        int a = parse_class_atom(p, &lo);
        if (a < 0)
            return -1;
        if (p->pos + 1 < p->len && p->s[p->pos] == '-' && p->s[p->pos + 1] != ']') {
            p->pos++;
            int b = parse_class_atom(p, &hi);
            if (b < 0)
                return -1;
            if (a || b)
                return err_set(p->err, "pattern: range with a class escape at byte %zu", at);
            if (lo > hi)
                return err_set(p->err, "pattern: range out of order at byte %zu", at);
            if (add_range(p, lo, hi))
                return -1;
        } else if (!a && add_range(p, lo, lo)) {
            return -1;
        }
    }
    p->pos++;
    return finish_set(p, negate, id);
}

static int parse_atom(parser *p, uint32_t *id)
{
    size_t at = p->pos;
    uint8_t c = p->s[at];
    uint32_t cp;
    int r;
    switch (c) {
    case '(':
        return parse_group(p, id);
    case '[':
        return parse_class(p, id);
    case '.':
        p->pos++;
        if (add_ranges(p, line_ends, ARRAY_LEN(line_ends), true))
            return -1;
        return finish_set(p, false, id);
    case '\\':
        r = parse_escape(p, false, &cp);
        if (r < 0 || (r == 0 && add_range(p, cp, cp)))
            return -1;
        return finish_set(p, false, id);
    case '*':
    case '+':
    case '?':
        return err_set(p->err, "pattern: '%c' at byte %zu repeats nothing", c, at);
    case '{':
        if (repeat_at(p, at))
            return err_set(p->err, "pattern: '{' at byte %zu repeats nothing", at);
        return err_set(p->err, "pattern: '{' at byte %zu starts no repeat count (write \\{ for "
                               "the character)", at);
    case '}':
    case ']':
        return err_set(p->err, "pattern: lone '%c' at byte %zu (write \\%c for the character)",
                       c, at, c);
    }
    int32_t v = utf8_next(p);
    if (v < 0)
        return err_set(p->err, "pattern: invalid UTF-8 at byte %zu", at);
    if (add_range(p, (uint32_t)v, (uint32_t)v))
        return -1;
    return finish_set(p, false, id);
}

/* Terms up to the next '|' or ')' as one node; at the top level, a leading ^ and a
 * trailing $ are its anchors. */
static int parse_alternative(parser *p, bool top, uint32_t *id, bool *start, bool *end)
{
    *start = *end = false;
    if (top && p->pos < p->len && p->s[p->pos] == '^') {
        *start = true;
        p->pos++;
    }
    uint32_t base = p->n_stack;
    while (p->pos < p->len && p->s[p->pos] != '|' && p->s[p->pos] != ')') {
        size_t at = p->pos;
        uint8_t c = p->s[at];
        if (c == '$' && top && (at + 1 == p->len || p->s[at + 1] == '|')) {
            *end = true;
            p->pos++;
            break;
        }
        if (c == '$' || c == '^')
            return err_set(p->err, "pattern: anchor '%c' at byte %zu is not supported (only at "
                                   "the %s of the pattern or of one of its alternatives)", c, at,
                           c == '^' ? "start" : "end");
        uint32_t atom;
        if (parse_atom(p, &atom) || parse_repeat(p, &atom) || push(p, atom))
            return -1;
    }
    return finish_list(p, NODE_CAT, base, id);
}

/* Alternatives up to a ')' (of a group) or the end (at the top level, where they become
 * the tree's branches). */
static int parse_disjunction(parser *p, bool top, uint32_t *id)
{
    tree *t = p->t;
    uint32_t base = p->n_stack;
    for (;;) {
        uint32_t alt;
        bool start, end;
        if (parse_alternative(p, top, &alt, &start, &end))
            return -1;
        if (top) {
            if (arraygrow((void **)&t->branches, &t->cap_branches, t->n_branches,
                     sizeof *t->branches, 1))
                return oom(p->err);
            t->branches[t->n_branches++] = (branch){alt, start, end};
        } else if (push(p, alt)) {
            return -1;
        }
        if (p->pos >= p->len || p->s[p->pos] != '|')
            break;
        p->pos++;
    }
    if (top && p->pos < p->len)
        return err_set(p->err, "pattern: ')' at byte %zu closes no group", p->pos);
    return top ? 0 : finish_list(p, NODE_ALT, base, id);
}

static int parse(const char *pattern, size_t len, tree *t, char *err)
{
    parser p = {.s = (const uint8_t *)pattern, .len = len, .t = t, .err = err};
    if (len > PATTERN_MAX)
        return err_set(err, "pattern: %zu bytes long, more than %u", len, PATTERN_MAX);
    int rc = parse_disjunction(&p, true, NULL);
    free(p.stack);
    free(p.set);
    return rc;
}

static void tree_free(tree *t)
{
    free(t->nodes);
    free(t->ranges);
    free(t->kids);
    free(t->branches);
}

/* ---- the NFA over bytes ---- */

enum { NFA_FAIL, NFA_BYTES, NFA_SPLIT, NFA_MATCH };

typedef struct nfa_state {
    uint8_t kind;
    uint8_t lo, hi;     /* NFA_BYTES: a byte in lo..hi leads to out */
    uint32_t out, out2; /* NFA_SPLIT: both, without a byte */
} nfa_state;

typedef struct nfa {
    nfa_state *states; /* state 0 is NFA_FAIL: what nothing leads out of */
    uint32_t n, cap;
    uint32_t *shared;  /* the NFA_BYTES states of the set being built, which its paths share */
    uint32_t n_shared, cap_shared;
    uint32_t start;
    uint32_t universal; /* the loop after an alternative without $ has matched: from it
                           every string is accepted; 0 when every alternative ends in $ */
    char *err;
} nfa;

static int nfa_add(nfa *m, nfa_state s, uint32_t *id)
{
    if (m->n == NFA_MAX)
        return err_set(m->err, "pattern: more than %u automaton states once its repeats are "
                               "expanded", NFA_MAX);
    if (arraygrow((void **)&m->states, &m->cap, m->n, sizeof *m->states, 1))
        return oom(m->err);
    *id = m->n;
    m->states[m->n++] = s;
    return 0;
}

/* A choice between entries a and b; NFA_FAIL is no choice. */
static int nfa_either(nfa *m, uint32_t a, uint32_t b, uint32_t *id)
{
    if (!a || !b) {
        *id = a ? a : b;
        return 0;
    }
    return nfa_add(m, (nfa_state){.kind = NFA_SPLIT, .out = a, .out2 = b}, id);
}

/* A state taking a byte in lo..hi to out: one the set being built has already, or a new
 * one. Paths that end alike share their ends (after E1 and after EE, the two bytes left
 * are any continuation bytes), as RE2 shares them: the subsets of the deterministic
 * automaton are then as few as its states, rather than one per path. */
static int nfa_bytes(nfa *m, uint8_t lo, uint8_t hi, uint32_t out, uint32_t *id)
{
    for (uint32_t i = 0; i < m->n_shared; i++) {
        const nfa_state *s = &m->states[m->shared[i]];
        if (s->lo == lo && s->hi == hi && s->out == out) {
            *id = m->shared[i];
            return 0;
        }
    }
    if (nfa_add(m, (nfa_state){.kind = NFA_BYTES, .lo = lo, .hi = hi, .out = out}, id))
        return -1;
    if (arraygrow((void **)&m->shared, &m->cap_shared, m->n_shared, sizeof *m->shared, 1))
        return oom(m->err);
    m->shared[m->n_shared++] = *id;
    return 0;
}

/* Adds to *entry the byte sequences, each leading to next, of the characters lo..hi (no
 * surrogate among them): one NFA path of byte ranges per part of utf8_ranges' split. */
static int utf8_paths(nfa *m, uint32_t lo, uint32_t hi, uint32_t next, uint32_t *entry)
{
    utf8_range parts[UTF8_RANGES_MAX];
    int n = utf8_ranges(lo, hi, parts);
    for (int k = 0; k < n; k++) {
        uint32_t s = next;
        for (int i = parts[k].len; i-- > 0;)
            if (nfa_bytes(m, parts[k].lo[i], parts[k].hi[i], s, &s))
                return -1;
        if (nfa_either(m, s, *entry, entry))
            return -1;
    }
    return 0;
}

/* The characters of the n ranges r that JSON can write raw, each leading to next. */
static int nfa_set(nfa *m, const range *r, uint32_t n, uint32_t next, uint32_t *entry)
{
    *entry = 0;
    m->n_shared = 0;
    for (uint32_t i = 0, j = 0; i < n && j < ARRAY_LEN(writable);) {
        uint32_t lo = r[i].lo > writable[j].lo ? r[i].lo : writable[j].lo;
        uint32_t hi = r[i].hi < writable[j].hi ? r[i].hi : writable[j].hi;
        if (lo <= hi && utf8_paths(m, lo, hi, next, entry))
            return -1;
        if (r[i].hi < writable[j].hi)
            i++;
        else
            j++;
    }
    return 0;
}

/* A loop taking any character, then leaving to next: [\s\S]* before it. */
static int nfa_any_loop(nfa *m, uint32_t next, uint32_t *entry)
{
    uint32_t body;
    if (nfa_add(m, (nfa_state){.kind = NFA_SPLIT, .out2 = next}, entry) ||
        nfa_set(m, any_char, ARRAY_LEN(any_char), *entry, &body))
        return -1;
    m->states[*entry].out = body;
    return 0;
}

static int nfa_node(nfa *m, const tree *t, uint32_t id, uint32_t next, uint32_t *entry);

static int nfa_repeat(nfa *m, const tree *t, const node *r, uint32_t next, uint32_t *entry)
{
    uint32_t tail = next, copies = r->min, body;
    if (r->max == UNBOUNDED) {
        /* a loop choosing between one more and what follows; x{n,} is n - 1 copies, then
         * x+, which enters at the body rather than at the choice */
        uint32_t loop;
        if (nfa_add(m, (nfa_state){.kind = NFA_SPLIT, .out2 = next}, &loop) ||
            nfa_node(m, t, r->first, loop, &body))
            return -1;
        m->states[loop].out = body;
        tail = loop;
        if (copies) {
            tail = body;
            copies--;
        }
    } else {
        /* x{n,m}: n copies, then m - n nested optional ones, x(x(x)?)?, each choice leading
         * straight to next, so that a closure over them stays short */
        for (uint32_t i = r->min; i < r->max; i++)
            if (nfa_node(m, t, r->first, tail, &body) || nfa_either(m, body, next, &tail))
                return -1;
    }
    for (; copies; copies--)
        if (nfa_node(m, t, r->first, tail, &tail))
            return -1;
    *entry = tail;
    return 0;
}

/* Node id followed by next (built backwards, so that every state is made with its
 * successors known): its entry. */
static int nfa_node(nfa *m, const tree *t, uint32_t id, uint32_t next, uint32_t *entry)
{
    const node *d = &t->nodes[id];
    *entry = 0;
    if (!next) /* nothing after it matches: neither does it */
        return 0;
    switch (d->kind) {
    case NODE_SET:
        return nfa_set(m, t->ranges + d->first, d->n, next, entry);
    case NODE_CAT:
        for (uint32_t i = d->n; i-- > 0;)
            if (nfa_node(m, t, t->kids[d->first + i], next, &next))
                return -1;
        *entry = next;
        return 0;
    case NODE_ALT:
        for (uint32_t i = d->n; i-- > 0;) {
            uint32_t e;
            if (nfa_node(m, t, t->kids[d->first + i], next, &e) || nfa_either(m, e, *entry, entry))
                return -1;
        }
        return 0;
    default:
        return nfa_repeat(m, t, d, next, entry);
    }
}

/* The whole pattern: a branch without ^ is searched for ([\s\S]* before it), one without $
 * may be followed by anything (the universal loop). */
static int nfa_build(nfa *m, const tree *t)
{
    uint32_t fail, match, anchored = 0, floating = 0;
    if (nfa_add(m, (nfa_state){.kind = NFA_FAIL}, &fail) ||
        nfa_add(m, (nfa_state){.kind = NFA_MATCH}, &match))
        return -1;
    for (uint32_t i = 0; i < t->n_branches; i++)
        if (!t->branches[i].end && !m->universal && nfa_any_loop(m, match, &m->universal))
            return -1;
    for (uint32_t i = 0; i < t->n_branches; i++) {
        const branch *b = &t->branches[i];
        uint32_t e, *into = b->start ? &anchored : &floating;
        if (nfa_node(m, t, b->node, b->end ? match : m->universal, &e) ||
            nfa_either(m, e, *into, into))
            return -1;
    }
    if (floating && nfa_any_loop(m, floating, &floating))
        return -1;
    return nfa_either(m, anchored, floating, &m->start);
}

/* ---- automata over byte classes ---- */

typedef struct automaton {
    uint32_t n, cap; /* states (0 is dead: all its row 0, not accepting), room for them */
    uint32_t k;      /* byte classes */
    uint32_t start;
    uint32_t *next;  /* (n * k) the state after a byte of each class */
    bool *accept;    /* (n) */
    uint8_t cls[256]; /* each byte's class */
} automaton;

static void automaton_free(automaton *a)
{
    free(a->next);
    free(a->accept);
}

/* A new state, its row all dead; past REGEX_STATES_MAX, a refusal (why: what bounded). */
static int automaton_add(automaton *a, bool accept, const char *why, char *err, uint32_t *id)
{
    if (a->n == REGEX_STATES_MAX)
        return err_set(err, "pattern: its automaton%s needs more than %d states", why,
                       REGEX_STATES_MAX);
    if (a->n == a->cap) {
        uint32_t cap = a->cap ? 2 * a->cap : 64;
        uint32_t *next = realloc(a->next, (size_t)cap * a->k * sizeof *next);
        if (!next)
            return oom(err);
        a->next = next;
        bool *acc = realloc(a->accept, cap * sizeof *acc);
        if (!acc)
            return oom(err);
        a->accept = acc;
        a->cap = cap;
    }
    *id = a->n++;
    a->accept[*id] = accept;
    memset(a->next + (size_t)*id * a->k, 0, a->k * sizeof *a->next);
    return 0;
}

static uint32_t hash_words(const uint32_t *w, uint32_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    for (uint32_t i = 0; i < n; i++) {
        h = (h ^ w[i]) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
    }
    return (uint32_t)h;
}

/* ---- subset construction ---- */

/* A hash of a set of NFA states that does not depend on their order, so that a subset is
 * found without sorting it: each state's mix, summed. */
static uint32_t hash_set(const uint32_t *q, uint32_t n)
{
    uint64_t sum = 0x9E3779B97F4A7C15ull ^ n;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t h = (q[i] + 0x632BE59BD9B4E019ull) * 0xFF51AFD7ED558CCDull;
        sum += h ^ (h >> 32);
    }
    return (uint32_t)(sum ^ (sum >> 32));
}

typedef struct subsets {
    const nfa *m;
    automaton *a;
    uint32_t *held;  /* the NFA states of each DFA state (its NFA_BYTES and NFA_MATCH ones,
                        in no order), one state's after another's */
    uint32_t n_held, cap_held;
    uint32_t *off;   /* (a->n + 1) where each DFA state's NFA states start in held */
    uint32_t cap_off;
    uint32_t *slots; /* (HASH_SLOTS) DFA states + 1 by their NFA states; 0: free */
    uint32_t *mark;  /* (m->n) the closure that last reached each NFA state */
    uint32_t gen;
    uint32_t *todo;  /* the closure's stack */
    uint32_t n_todo, cap_todo;
    uint32_t universal; /* the DFA state of the NFA's universal loop; UINT32_MAX until made */
    uint64_t work;        /* steps taken, those of the caller's earlier patterns in */
    uint64_t work_before; /* the earlier patterns' steps */
    char *err;
} subsets;

static int too_complex(const subsets *d)
{
    if (d->work_before)
        return err_set(d->err, "pattern: too complex: its automaton and those of the patterns "
                               "before it take more than %u steps to build", REGEX_WORK_MAX);
    return err_set(d->err, "pattern: too complex: its automaton takes more than %u steps to build",
                   REGEX_WORK_MAX);
}

static int todo_push(subsets *d, uint32_t q)
{
    if (arraygrow((void **)&d->todo, &d->cap_todo, d->n_todo, sizeof *d->todo, 1))
        return oom(d->err);
    d->todo[d->n_todo++] = q;
    return 0;
}

/* Whether every NFA state of DFA state s is in the closure just taken (as both sets hold
 * no state twice, with equal sizes: whether they are the same set). */
static bool subset_is_marked(const subsets *d, uint32_t s)
{
    for (uint32_t i = d->off[s]; i < d->off[s + 1]; i++)
        if (d->mark[d->held[i]] != d->gen)
            return false;
    return true;
}

/* The DFA state of the NFA states that seeds lead to without a byte: found, or made. A
 * set that holds the universal loop accepts every string, as the loop alone does: it is
 * the loop's state, whatever else it holds. */
static int subset_state(subsets *d, const uint32_t *seeds, uint32_t n_seeds, uint32_t *id)
{
    const nfa *m = d->m;
    uint32_t base = d->n_held;
    bool accept = false, universal = false;
    d->gen++;
    d->n_todo = 0;
    for (uint32_t i = 0; i < n_seeds; i++)
        if (todo_push(d, seeds[i]))
            return -1;
    while (d->n_todo) {
        uint32_t q = d->todo[--d->n_todo];
        if (!q || d->mark[q] == d->gen)
            continue;
        d->mark[q] = d->gen;
        if (++d->work > REGEX_WORK_MAX)
            return too_complex(d);
        const nfa_state *s = &m->states[q];
        universal |= q == m->universal;
        if (s->kind == NFA_SPLIT) {
            if (todo_push(d, s->out) || todo_push(d, s->out2))
                return -1;
            continue;
        }
        accept |= s->kind == NFA_MATCH;
        if (d->n_held == HELD_MAX)
            return too_complex(d);
        if (arraygrow((void **)&d->held, &d->cap_held, d->n_held, sizeof *d->held, 1))
            return oom(d->err);
        d->held[d->n_held++] = q;
    }
    if (universal && d->universal != UINT32_MAX) {
        d->n_held = base;
        *id = d->universal;
        return 0;
    }
    uint32_t n = d->n_held - base, slot;
    for (slot = hash_set(d->held + base, n) & (HASH_SLOTS - 1);;
         slot = (slot + 1) & (HASH_SLOTS - 1)) {
        uint32_t s = d->slots[slot];
        if (!s)
            break;
        s--;
        if (d->off[s + 1] - d->off[s] == n && subset_is_marked(d, s)) {
            d->n_held = base;
            *id = s;
            return 0;
        }
    }
    if (automaton_add(d->a, accept, "", d->err, id) ||
        arraygrow((void **)&d->off, &d->cap_off, *id + 1, sizeof *d->off, 1))
        return -1;
    d->off[*id + 1] = d->n_held;
    d->slots[slot] = *id + 1;
    return 0;
}

/* The bytes' classes: bytes that no NFA state's range tells apart are one, and
 * continuation bytes (0x80-0xBF) are apart from the others, which the count of characters
 * needs. */
static void nfa_classes(const nfa *m, automaton *a)
{
    bool cut[256] = {false};
    cut[0x80] = cut[0xC0] = true;
    for (uint32_t i = 0; i < m->n; i++)
        if (m->states[i].kind == NFA_BYTES) {
            cut[m->states[i].lo] = true;
            if (m->states[i].hi < 255)
                cut[m->states[i].hi + 1] = true;
        }
    uint32_t k = 0;
    for (int b = 0; b < 256; b++) {
        k += b && cut[b];
        a->cls[b] = (uint8_t)k;
    }
    a->k = k + 1;
}

/* The subset construction of m into a, its steps counted into *work. */
static int determinise(const nfa *m, automaton *a, uint64_t *work, char *err)
{
    subsets d = {.m = m, .a = a, .universal = UINT32_MAX, .work = *work, .work_before = *work,
                 .err = err};
    uint32_t *targets = NULL, cap_targets = 0, count[256], at[256], dead;
    nfa_classes(m, a);
    int rc = -1;
    d.slots = calloc(HASH_SLOTS, sizeof *d.slots);
    d.mark = calloc(m->n, sizeof *d.mark);
    if (!d.slots || !d.mark || arraygrow((void **)&d.off, &d.cap_off, 0, sizeof *d.off, 2)) {
        oom(err);
        goto out;
    }
    /* state 0: the empty set, dead */
    if (automaton_add(a, false, "", err, &dead))
        goto out;
    d.off[0] = d.off[1] = 0;
    d.slots[hash_set(NULL, 0) & (HASH_SLOTS - 1)] = 1;
    if ((m->universal && subset_state(&d, &m->universal, 1, &d.universal)) ||
        subset_state(&d, &m->start, 1, &a->start))
        goto out;
    for (uint32_t s = 1; s < a->n; s++) {
        /* the NFA states each class leads to, class by class in targets */
        uint32_t k = a->k, total = 0;
        memset(count, 0, k * sizeof *count);
        for (uint32_t i = d.off[s]; i < d.off[s + 1]; i++) {
            const nfa_state *q = &m->states[d.held[i]];
            if (q->kind != NFA_BYTES)
                continue;
            for (uint32_t c = a->cls[q->lo]; c <= a->cls[q->hi]; c++, total++)
                count[c]++;
        }
        d.work += total;
        if (d.work > REGEX_WORK_MAX) {
            too_complex(&d);
            goto out;
        }
        if (arraygrow((void **)&targets, &cap_targets, 0, sizeof *targets, total)) {
            oom(err);
            goto out;
        }
        for (uint32_t c = 0, sum = 0; c < k; c++) {
            at[c] = sum;
            sum += count[c];
        }
        for (uint32_t i = d.off[s]; i < d.off[s + 1]; i++) {
            const nfa_state *q = &m->states[d.held[i]];
            if (q->kind != NFA_BYTES)
                continue;
            for (uint32_t c = a->cls[q->lo]; c <= a->cls[q->hi]; c++)
                targets[at[c]++] = q->out;
        }
        for (uint32_t c = 0; c < k; c++) {
            uint32_t t;
            if (!count[c])
                continue;
            if (subset_state(&d, targets + at[c] - count[c], count[c], &t))
                goto out;
            a->next[(size_t)s * k + c] = t;
        }
    }
    rc = 0;
out:
    *work = d.work;
    free(targets);
    free(d.held);
    free(d.off);
    free(d.slots);
    free(d.mark);
    free(d.todo);
    return rc;
}

/* ---- minimising ---- */

/* Minimises a (whose states are all reached from its start): Hopcroft's partition
 * refinement, then the blocks renumbered breadth first from the start, the dead state's
 * block 0. Every state that reaches no accepting one is in the dead block, so the result
 * is trimmed too. */
static int minimise(automaton *a, char *err)
{
    uint32_t n = a->n, k = a->k, nb = 0, nw = 0, m = 0;
    size_t nk = (size_t)n * k;
    /* predecessors by class and state: pred[pred_at[c * n + q] .. pred_at[c * n + q + 1]) */
    uint32_t *pred_at = calloc(nk + 1, sizeof *pred_at);
    uint32_t *pred = malloc(nk * sizeof *pred);
    uint32_t *part = malloc(9 * (size_t)n * sizeof *part);
    bool *in_work = calloc(n, sizeof *in_work);
    uint32_t *next = NULL;
    bool *accept = NULL;
    int rc = -1;
    if (!pred_at || !pred || !part || !in_work) {
        oom(err);
        goto out;
    }
    for (size_t e = 0; e < nk; e++)
        pred_at[(e % k) * n + a->next[e]]++;
    for (size_t i = 0, sum = 0; i <= nk; i++) {
        sum += pred_at[i];
        pred_at[i] = (uint32_t)sum;
    }
    for (size_t e = nk; e-- > 0;)
        pred[--pred_at[(e % k) * n + a->next[e]]] = (uint32_t)(e / k);
    /* the partition: each block's states are elems[first[b] .. end[b]), the first
     * marked[b] of them marked by the splitter at work */
    uint32_t *elems = part, *loc = elems + n, *blk = loc + n, *first = blk + n,
             *end = first + n, *marked = end + n, *work = marked + n, *touched = work + n,
             *snap = touched + n;
    uint32_t n_acc = 0;
    for (uint32_t q = 0; q < n; q++)
        n_acc += a->accept[q];
    for (uint32_t q = 0, ia = 0, ir = n_acc; q < n; q++) {
        loc[q] = a->accept[q] ? ia++ : ir++;
        elems[loc[q]] = q;
        blk[q] = a->accept[q] ? 0 : n_acc > 0;
    }
    if (n_acc) {
        first[nb] = 0;
        end[nb++] = n_acc;
    }
    if (n_acc < n) {
        first[nb] = n_acc;
        end[nb++] = n;
    }
    for (uint32_t b = 0; b < nb; b++)
        marked[b] = 0;
    if (nb == 2) {
        work[nw] = n_acc <= n - n_acc ? 0 : 1;
        in_work[work[nw++]] = true;
    }
    while (nw) {
        uint32_t s = work[--nw], ns = end[s] - first[s];
        in_work[s] = false;
        memcpy(snap, elems + first[s], ns * sizeof *snap);
        for (uint32_t c = 0; c < k; c++) {
            uint32_t nt = 0;
            for (uint32_t i = 0; i < ns; i++) {
                size_t at = (size_t)c * n + snap[i];
                for (uint32_t j = pred_at[at]; j < pred_at[at + 1]; j++) {
                    uint32_t q = pred[j], b = blk[q], to = first[b] + marked[b], from = loc[q];
                    if (from < to)
                        continue;
                    elems[from] = elems[to];
                    loc[elems[from]] = from;
                    elems[to] = q;
                    loc[q] = to;
                    if (marked[b]++ == 0)
                        touched[nt++] = b;
                }
            }
            for (uint32_t i = 0; i < nt; i++) {
                uint32_t b = touched[i], mk = marked[b];
                marked[b] = 0;
                if (mk == end[b] - first[b])
                    continue;
                uint32_t y = nb++;
                first[y] = first[b];
                end[y] = first[b] = first[b] + mk;
                marked[y] = 0;
                for (uint32_t j = first[y]; j < end[y]; j++)
                    blk[elems[j]] = y;
                /* a block at work splits into two at work; another, into its smaller half
                 * (splitting by the other half then says nothing new) */
                uint32_t add = in_work[b] || mk < end[b] - first[b] ? y : b;
                work[nw++] = add;
                in_work[add] = true;
            }
        }
    }
    /* renumbering, breadth first from the dead block and the start's */
    uint32_t *map = work, *order = touched, *rep = snap;
    for (uint32_t b = 0; b < nb; b++) {
        map[b] = UINT32_MAX;
        rep[b] = elems[first[b]];
    }
    order[m] = blk[0];
    map[blk[0]] = m++;
    if (map[blk[a->start]] == UINT32_MAX) {
        order[m] = blk[a->start];
        map[blk[a->start]] = m++;
    }
    for (uint32_t i = 1; i < m; i++)
        for (uint32_t c = 0; c < k; c++) {
            uint32_t t = blk[a->next[(size_t)rep[order[i]] * k + c]];
            if (map[t] == UINT32_MAX) {
                order[m] = t;
                map[t] = m++;
            }
        }
    next = malloc((size_t)m * k * sizeof *next);
    accept = malloc(m * sizeof *accept);
    if (!next || !accept) {
        oom(err);
        goto out;
    }
    for (uint32_t i = 0; i < m; i++) {
        accept[i] = a->accept[rep[order[i]]];
        for (uint32_t c = 0; c < k; c++)
            next[(size_t)i * k + c] = map[blk[a->next[(size_t)rep[order[i]] * k + c]]];
    }
    a->start = map[blk[a->start]];
    a->n = a->cap = m;
    free(a->next);
    free(a->accept);
    a->next = next;
    a->accept = accept;
    next = NULL;
    accept = NULL;
    rc = 0;
out:
    free(pred_at);
    free(pred);
    free(part);
    free(in_work);
    free(next);
    free(accept);
    return rc;
}

/* ---- lengths ---- */

/* The fewest characters from each state of a (minimised: all but the dead one reach
 * acceptance) to an accepting state: 0-1 breadth-first search backwards, a byte that
 * starts a character costing one. */
static int distances(const automaton *a, const uint8_t *starts, uint32_t *dist, char *err)
{
    uint32_t n = a->n, k = a->k;
    size_t nk = (size_t)n * k, cap = nk + n + 1, head = 0, tail = 0;
    uint32_t *in_at = calloc(n + 1, sizeof *in_at); /* edges into q: in[in_at[q]..] */
    uint32_t *in = malloc(nk * sizeof *in);         /* each as its source * k + class */
    uint32_t *deque = malloc(cap * sizeof *deque);
    if (!in_at || !in || !deque) {
        free(in_at);
        free(in);
        free(deque);
        return oom(err);
    }
    for (size_t e = 0; e < nk; e++)
        in_at[a->next[e] + 1]++;
    for (uint32_t q = 0; q < n; q++)
        in_at[q + 1] += in_at[q];
    for (size_t e = 0; e < nk; e++)
        in[in_at[a->next[e]]++] = (uint32_t)e;
    for (uint32_t q = n; q > 0; q--)
        in_at[q] = in_at[q - 1];
    in_at[0] = 0;
    for (uint32_t q = 0; q < n; q++) {
        dist[q] = a->accept[q] ? 0 : UINT32_MAX;
        if (a->accept[q])
            deque[tail++] = q;
    }
    while (head != tail) {
        uint32_t q = deque[head];
        head = (head + 1) % cap;
        for (uint32_t j = in_at[q]; j < in_at[q + 1]; j++) {
            uint32_t p = in[j] / k, w = starts[in[j] % k];
            if (dist[q] + w >= dist[p])
                continue;
            dist[p] = dist[q] + w;
            if (w) {
                deque[tail] = p;
                tail = (tail + 1) % cap;
            } else {
                head = (head + cap - 1) % cap;
                deque[head] = p;
            }
        }
    }
    free(in_at);
    free(in);
    free(deque);
    return 0;
}

typedef struct pair {
    uint32_t d, c; /* a state of the automaton counted, and the characters so far */
} pair;

typedef struct counter {
    const automaton *a;
    automaton *p;
    pair *pairs;     /* (p->n) what each product state is */
    uint32_t cap;
    uint32_t *slots;       /* (HASH_SLOTS) product states + 1 by (state, count); 0: free */
    uint32_t min, max;
    char *err;
} counter;

/* The product state of a's state d with c characters written: found, or made. */
static int pair_state(counter *t, uint32_t d, uint32_t c, uint32_t *id)
{
    uint32_t key[2] = {d, c}, slot;
    for (slot = hash_words(key, 2) & (HASH_SLOTS - 1);; slot = (slot + 1) & (HASH_SLOTS - 1)) {
        uint32_t s = t->slots[slot];
        if (!s)
            break;
        if (t->pairs[s - 1].d == d && t->pairs[s - 1].c == c) {
            *id = s - 1;
            return 0;
        }
    }
    if (automaton_add(t->p, t->a->accept[d] && c >= t->min && c <= t->max, " within its lengths",
                      t->err, id))
        return -1;
    if (arraygrow((void **)&t->pairs, &t->cap, *id, sizeof *t->pairs, 1))
        return oom(t->err);
    t->pairs[*id] = (pair){d, c};
    t->slots[slot] = *id + 1;
    return 0;
}

/* a (minimised) times a count of characters: what also has min to max of them. The
 * count stops at min when there is no max (more is as good), and a state that cannot
 * reach acceptance within max characters is dead. */
static int count_chars(const automaton *a, uint32_t min, uint32_t max, automaton *p, char *err)
{
    counter t = {.a = a, .p = p, .min = min, .max = max, .err = err};
    bool bounded = max != UINT32_MAX;
    uint8_t starts[256];
    uint32_t k = a->k, dead;
    int rc = -1;
    for (int b = 255; b >= 0; b--)
        starts[a->cls[b]] = b < 0x80 || b >= 0xC0;
    p->k = k;
    memcpy(p->cls, a->cls, sizeof p->cls);
    uint32_t *dist = malloc(a->n * sizeof *dist);
    t.slots = calloc(HASH_SLOTS, sizeof *t.slots);
    if (!dist || !t.slots) {
        oom(err);
        goto out;
    }
    if (distances(a, starts, dist, err) || automaton_add(p, false, "", err, &dead))
        goto out;
    p->start = dead;
    if (a->start && (!bounded || dist[a->start] <= max) && pair_state(&t, a->start, 0, &p->start))
        goto out;
    for (uint32_t s = 1; s < p->n; s++)
        for (uint32_t c = 0; c < k; c++) {
            uint32_t d = a->next[(size_t)t.pairs[s].d * k + c], id;
            uint64_t chars = (uint64_t)t.pairs[s].c + starts[c];
            if (!d || (bounded && chars + dist[d] > max))
                continue;
            if (!bounded && chars > min)
                chars = min;
            if (pair_state(&t, d, (uint32_t)chars, &id))
                goto out;
            p->next[(size_t)s * k + c] = id;
        }
    rc = 0;
out:
    free(dist);
    free(t.slots);
    free(t.pairs);
    return rc;
}

/* ---- the result ---- */

struct regex_dfa {
    size_t bytes;       /* of this allocation */
    uint32_t n_classes;
    uint16_t start;
    uint8_t byte_class[256];
    const bool *accept; /* (states) after the table */
    uint16_t table[];   /* (states * n_classes) the state after a byte of each class */
};

/* a as the result, its classes that no state tells apart made one. */
static int emit(const automaton *a, regex_dfa **out, char *err)
{
    uint32_t n = a->n, k = 0, col[256], merged[256];
    uint32_t hash[256];
    for (uint32_t c = 0; c < a->k; c++) {
        uint64_t h = 0x9E3779B97F4A7C15ull;
        for (uint32_t s = 0; s < n; s++)
            h = ((h ^ a->next[(size_t)s * a->k + c]) * 0xFF51AFD7ED558CCDull) ^ (h >> 29);
        hash[c] = (uint32_t)(h ^ h >> 32);
        merged[c] = UINT32_MAX;
        for (uint32_t j = 0; j < k && merged[c] == UINT32_MAX; j++) {
            uint32_t o = col[j], s = 0;
            if (hash[o] != hash[c])
                continue;
            while (s < n && a->next[(size_t)s * a->k + o] == a->next[(size_t)s * a->k + c])
                s++;
            if (s == n)
                merged[c] = j;
        }
        if (merged[c] == UINT32_MAX) {
            col[k] = c;
            merged[c] = k++;
        }
    }
    size_t bytes = sizeof(regex_dfa) + (size_t)n * k * sizeof(uint16_t) + n * sizeof(bool);
    regex_dfa *d = malloc(bytes);
    if (!d)
        return oom(err);
    d->bytes = bytes;
    d->n_classes = k;
    d->start = (uint16_t)a->start;
    for (int b = 0; b < 256; b++)
        d->byte_class[b] = (uint8_t)merged[a->cls[b]];
    bool *accept = (bool *)(d->table + (size_t)n * k);
    for (uint32_t s = 0; s < n; s++) {
        accept[s] = a->accept[s];
        for (uint32_t j = 0; j < k; j++)
            d->table[(size_t)s * k + j] = (uint16_t)a->next[(size_t)s * a->k + col[j]];
    }
    d->accept = accept;
    *out = d;
    return 0;
}

static int no_match(const char *pattern, size_t len, uint32_t min, uint32_t max, char *err)
{
    int shown = len > 64 ? 64 : (int)len;
    const char *more = len > 64 ? "..." : "";
    if (max == UINT32_MAX)
        return err_set(err, "pattern: no string matches '%.*s%s' within its lengths (at least "
                            "%u characters)", shown, pattern, more, min);
    return err_set(err, "pattern: no string matches '%.*s%s' within its lengths (%u to %u "
                        "characters)", shown, pattern, more, min, max);
}

int regex_compile(const char *pattern, size_t len, uint32_t min_chars, uint32_t max_chars,
                  regex_dfa **out, char err[ERR_MAX])
{
    uint64_t work = 0;
    return regex_compile_sharing(pattern, len, min_chars, max_chars, &work, out, err);
}

int regex_compile_sharing(const char *pattern, size_t len, uint32_t min_chars,
                          uint32_t max_chars, uint64_t *work, regex_dfa **out, char err[ERR_MAX])
{
    tree t = {0};
    nfa m = {.err = err};
    automaton a = {0}, p = {0};
    *out = NULL;
    int rc = parse(pattern, len, &t, err);
    if (!rc)
        rc = nfa_build(&m, &t);
    tree_free(&t);
    if (!rc)
        rc = determinise(&m, &a, work, err);
    free(m.states);
    free(m.shared);
    if (!rc)
        rc = minimise(&a, err);
    if (!rc)
        rc = count_chars(&a, min_chars, max_chars, &p, err);
    if (!rc)
        rc = minimise(&p, err);
    if (!rc && p.start == REGEX_DEAD)
        rc = no_match(pattern, len, min_chars, max_chars, err);
    if (!rc)
        rc = emit(&p, out, err);
    automaton_free(&a);
    automaton_free(&p);
    return rc;
}

void regex_free(regex_dfa *dfa)
{
    free(dfa);
}

uint16_t regex_start(const regex_dfa *dfa)
{
    return dfa->start;
}

uint16_t regex_step(const regex_dfa *dfa, uint16_t state, uint8_t byte)
{
    return dfa->table[(size_t)state * dfa->n_classes + dfa->byte_class[byte]];
}

bool regex_accepts(const regex_dfa *dfa, uint16_t state)
{
    return dfa->accept[state];
}

size_t regex_bytes(const regex_dfa *dfa)
{
    return dfa->bytes;
}
