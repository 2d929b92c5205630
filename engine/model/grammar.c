/* grammar.c — GBNF compiled into rules over bytes, and a recogniser over sets of parse
 * stacks (see grammar.h).
 *
 * The route: the text is parsed (llama.cpp's reading of GBNF) straight into rules whose
 * alternatives are sequences of elements, each a set of bytes or a reference to a rule: a
 * literal's characters become their UTF-8 bytes, a class the byte ranges of its characters
 * (utf8_ranges) grouped by the bytes that follow the first, and a repetition rules of its
 * own as llama.cpp writes them (x* is R ::= x R | "", x{0,2} is O2 ::= x O1 | "" with
 * O1 ::= x | ""). The rules are then checked (defined, root, left recursion, every rule
 * root uses can finish) and the start's stacks found once, within the bounds.
 *
 * A stack lists positions in the elements, the innermost last: each the next element to
 * match in an alternative entered. Its top is always a byte set: a reference on top is
 * expanded, one stack per alternative of its rule, with the reference's continuation kept
 * beneath unless it ends its alternative (so a rule called last does not deepen the
 * stack); the end of an alternative returns to the position beneath. A byte keeps the
 * stacks whose top takes it, advanced and expanded again. An empty stack is a finished
 * sentence: the set's `complete` flag.
 *
 * A cursor interns every set of stacks it meets (identical sets are one state) and, the
 * first time a state is asked about, fills its row: the state after each byte, found with
 * one step per class of bytes that its stacks' tops tell apart. A token's test then reads
 * a row per byte. When the table is full a step outside it is taken from the stacks
 * themselves (scratch, not kept), and the next move of the cursor starts the table afresh.
 */
#include "engine/model/grammar.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/arraygrow.h"
#include "engine/tok/utf8.h"

/* ---- the compiled grammar ---- */

/* An element: its kind in the low 2 bits, its argument (a set or a rule) above. */
enum { E_END, E_SET, E_REF };
#define ELEM(kind, arg) ((uint32_t)(arg) << 2 | (uint32_t)(kind))
#define KIND(e) ((e) & 3u)
#define ARG(e) ((e) >> 2)

#define NONE UINT32_MAX
#define CP_MAX 0x10FFFFu

struct grammar {
    uint32_t *elems;     /* (n_elems) every alternative's elements, each alternative ended by
                            E_END */
    uint32_t *alts;      /* (n_alts) where each alternative starts in elems, rule by rule */
    uint32_t *rule_alts; /* (n_rules + 1) rule r's alternatives are alts[rule_alts[r],
                            rule_alts[r + 1]) */
    uint64_t (*sets)[4]; /* (n_sets) byte sets, bit b of word b / 64 for byte b */
    uint32_t n_elems, n_alts, n_rules, n_sets;
    uint32_t start;      /* the element every reply starts at: a reference to root, then
                            E_END */
};

static bool set_has(const grammar *g, uint32_t pos, uint8_t b)
{
    return g->sets[ARG(g->elems[pos])][b >> 6] >> (b & 63) & 1;
}

/* ---- sets of stacks, and a step over one byte ---- */

/* The words a set of stacks may hold: each stack its length, then its positions. */
#define SET_WORDS (GRAMMAR_STACKS_MAX * (GRAMMAR_DEPTH_MAX + 1))
/* The words of the stacks a step records as expanded (beyond them it expands again what
 * it has expanded before, within GRAMMAR_EXPAND_MAX). */
#define SEEN_WORDS (1u << 16)
/* Slots of the open-addressed tables of a step: at most half full. */
#define OUT_SLOTS (2 * GRAMMAR_STACKS_MAX)
#define SEEN_SLOTS (2 * GRAMMAR_EXPAND_MAX)

/* What a step says. */
enum { STEP_OK, STEP_REFUSED, STEP_STACKS, STEP_DEPTH, STEP_EXPAND };

typedef struct stackset {
    uint32_t *w;   /* (SET_WORDS) the stacks back to back: each its length, then its
                      positions, bottom first (its top is always a byte set) */
    uint32_t used; /* words of w in use */
    uint32_t n;    /* stacks */
    uint32_t hash; /* of the stacks, in their order */
    bool complete; /* an empty stack too: the text so far is a sentence */
} stackset;

/* A reference being expanded. */
typedef struct frame {
    uint32_t len;      /* the stack's length with the reference on top */
    uint32_t ref;      /* the reference's position */
    uint32_t alt, end; /* its rule's alternatives still to expand: alts[alt, end) */
} frame;

/* A slot of a step's tables: a stack by its hash and where its words are. */
typedef struct slot {
    uint32_t gen;  /* the step that wrote it (others are empty) */
    uint32_t hash; /* the stack's */
    uint32_t off;  /* where its length word is: in the set being built, or in seen */
} slot;

/* A step's scratch. */
typedef struct work {
    uint32_t *tmp;       /* (GRAMMAR_DEPTH_MAX + 1) the stack being expanded, bottom first */
    frame *frames;       /* (GRAMMAR_EXPAND_MAX) the expansions in progress, outermost first */
    uint32_t *seen;      /* (SEEN_WORDS) the stacks this step has expanded, as in a set */
    slot *out_slots;     /* (OUT_SLOTS) the stacks of the set being built */
    slot *seen_slots;    /* (SEEN_SLOTS) the stacks in seen */
    uint32_t seen_used;  /* words of seen in use */
    uint32_t gen;        /* the step under way (slots of other steps are empty) */
    uint32_t expansions; /* this step's so far */
} work;

static uint32_t hash_words(const uint32_t *w, uint32_t n)
{
    uint32_t h = n * 0x9E3779B1u;
    for (uint32_t i = 0; i < n; i++)
        h = (h ^ w[i]) * 0x01000193u + 0x7F4A7C15u;
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    return h;
}

static void work_free(work *wk)
{
    free(wk->tmp);
    free(wk->frames);
    free(wk->seen);
    free(wk->out_slots);
    free(wk->seen_slots);
}

static int work_init(work *wk)
{
    memset(wk, 0, sizeof *wk);
    wk->tmp = malloc(sizeof *wk->tmp * (GRAMMAR_DEPTH_MAX + 1));
    wk->frames = malloc(sizeof *wk->frames * GRAMMAR_EXPAND_MAX);
    wk->seen = malloc(sizeof *wk->seen * SEEN_WORDS);
    wk->out_slots = calloc(OUT_SLOTS, sizeof *wk->out_slots);
    wk->seen_slots = calloc(SEEN_SLOTS, sizeof *wk->seen_slots);
    if (!wk->tmp || !wk->frames || !wk->seen || !wk->out_slots || !wk->seen_slots) {
        work_free(wk);
        return -1;
    }
    return 0;
}

/* Starts building out: empty, and the step's tables emptied by a new generation. */
static void set_begin(work *wk, stackset *out)
{
    out->used = out->n = out->hash = 0;
    out->complete = false;
    wk->seen_used = wk->expansions = 0;
    if (++wk->gen == 0) {
        memset(wk->out_slots, 0, sizeof *wk->out_slots * OUT_SLOTS);
        memset(wk->seen_slots, 0, sizeof *wk->seen_slots * SEEN_SLOTS);
        wk->gen = 1;
    }
}

/* Adds stack s (len positions; none: the empty one) to out unless it is there. */
static int add_stack(work *wk, stackset *out, const uint32_t *s, uint32_t len)
{
    if (len == 0) {
        out->complete = true;
        return STEP_OK;
    }
    uint32_t h = hash_words(s, len);
    for (uint32_t i = h & (OUT_SLOTS - 1);; i = (i + 1) & (OUT_SLOTS - 1)) {
        slot *sl = &wk->out_slots[i];
        if (sl->gen != wk->gen) {
            if (out->n == GRAMMAR_STACKS_MAX)
                return STEP_STACKS;
            *sl = (slot){wk->gen, h, out->used};
            out->w[out->used] = len;
            memcpy(out->w + out->used + 1, s, sizeof *s * len);
            out->used += len + 1;
            out->n++;
            out->hash = out->hash * 0x01000193u + h;
            return STEP_OK;
        }
        if (sl->hash == h && out->w[sl->off] == len &&
            memcmp(out->w + sl->off + 1, s, sizeof *s * len) == 0)
            return STEP_OK;
    }
}

/* Whether this step has expanded stack s before; records it when not (while seen has
 * room: a stack not recorded is expanded again, which only costs time). */
static bool seen_before(work *wk, const uint32_t *s, uint32_t len)
{
    uint32_t h = hash_words(s, len);
    for (uint32_t i = h & (SEEN_SLOTS - 1);; i = (i + 1) & (SEEN_SLOTS - 1)) {
        slot *sl = &wk->seen_slots[i];
        if (sl->gen != wk->gen) {
            if (wk->seen_used + len + 1 <= SEEN_WORDS) {
                *sl = (slot){wk->gen, h, wk->seen_used};
                wk->seen[wk->seen_used] = len;
                memcpy(wk->seen + wk->seen_used + 1, s, sizeof *s * len);
                wk->seen_used += len + 1;
            }
            return false;
        }
        if (sl->hash == h && wk->seen[sl->off] == len &&
            memcmp(wk->seen + sl->off + 1, s, sizeof *s * len) == 0)
            return true;
    }
}

/* Expands wk->tmp[0..len) until every stack's top is a byte set (or it is empty), adding
 * those stacks to out. Depth first, with the expansions in progress on wk->frames: each
 * one restores the position it replaced when its alternatives are done, so the stack
 * beneath is what its parent left. */
static int closure(const grammar *g, work *wk, uint32_t len, stackset *out)
{
    uint32_t *tmp = wk->tmp, nf = 0;
    for (;;) {
        if (len > 0 && KIND(g->elems[tmp[len - 1]]) == E_REF) {
            if (!seen_before(wk, tmp, len)) {
                if (wk->expansions == GRAMMAR_EXPAND_MAX)
                    return STEP_EXPAND;
                wk->expansions++;
                uint32_t ref = tmp[len - 1], r = ARG(g->elems[ref]);
                wk->frames[nf++] = (frame){len, ref, g->rule_alts[r], g->rule_alts[r + 1]};
            }
        } else {
            int rc = add_stack(wk, out, tmp, len);
            if (rc != STEP_OK)
                return rc;
        }
        /* the innermost expansion with an alternative left */
        while (nf > 0 && wk->frames[nf - 1].alt == wk->frames[nf - 1].end) {
            nf--;
            tmp[wk->frames[nf].len - 1] = wk->frames[nf].ref;
        }
        if (nf == 0)
            return STEP_OK;
        frame *f = &wk->frames[nf - 1];
        uint32_t a = g->alts[f->alt++];
        len = f->len - 1;
        if (KIND(g->elems[f->ref + 1]) != E_END)
            tmp[len++] = f->ref + 1;
        if (KIND(g->elems[a]) != E_END)
            tmp[len++] = a;
        if (len > GRAMMAR_DEPTH_MAX)
            return STEP_DEPTH;
    }
}

/* The stacks after byte b from the stacks from[0..used) (as in a stackset), into out. */
static int step(const grammar *g, work *wk, const uint32_t *from, uint32_t used, uint8_t b,
                stackset *out)
{
    set_begin(wk, out);
    for (uint32_t at = 0; at < used;) {
        uint32_t len = from[at];
        const uint32_t *s = from + at + 1;
        at += len + 1;
        uint32_t top = s[len - 1];
        if (!set_has(g, top, b))
            continue;
        memcpy(wk->tmp, s, sizeof *s * (len - 1));
        if (KIND(g->elems[top + 1]) == E_END)
            len--;
        else
            wk->tmp[len - 1] = top + 1;
        int rc = closure(g, wk, len, out);
        if (rc != STEP_OK)
            return rc;
    }
    return out->n || out->complete ? STEP_OK : STEP_REFUSED;
}

/* The stacks before the first byte, into out. */
static int start_set(const grammar *g, work *wk, stackset *out)
{
    set_begin(wk, out);
    wk->tmp[0] = g->start;
    return closure(g, wk, 1, out);
}

/* ---- the compiler ---- */

/* What made a rule, for messages. */
enum { R_NAMED, R_GROUP, R_REPEAT, R_CLASS };

typedef struct rule_info {
    uint32_t first_alt, n_alts; /* its alternatives: the parser's alts[first_alt, +n_alts) */
    uint32_t name, name_len;    /* a named rule: its name in the text */
    uint32_t at;                /* where it was defined, or the text that made it */
    uint32_t used_at;           /* a named rule: where it was first used (NONE: not yet) */
    uint8_t kind;               /* R_* */
    bool defined;               /* a named rule: its definition was read */
} rule_info;

/* The alternatives being read at one depth of parentheses. */
typedef struct level {
    uint32_t *e;     /* (cap) their elements, each alternative ended by E_END: n in use */
    uint32_t n, cap;
    uint32_t n_alts; /* alternatives ended so far */
    uint32_t item;   /* where the last item of the sequence being read starts in e (NONE:
                        no item yet, so nothing to repeat) */
} level;

/* A part of a class: byte strings of one length, the first byte in first, byte i + 1 in
 * [lo[i], hi[i]]. */
typedef struct class_part {
    uint8_t len;          /* 1..4 bytes */
    uint8_t lo[3], hi[3]; /* (len - 1) the ranges of the bytes after the first */
    uint64_t first[4];    /* (256 bits) the first bytes */
} class_part;

/* Code points lo..hi. */
typedef struct cp_range {
    uint32_t lo, hi;
} cp_range;

typedef struct parser {
    const char *text; /* (len) the grammar, valid UTF-8 without NUL bytes */
    size_t len, pos;  /* pos: the next byte to read */
    char *err;        /* (ERR_MAX) */
    uint32_t *elems; /* (n_elems) the finished rules' alternatives */
    uint32_t n_elems, cap_elems;
    uint32_t pending; /* elements in the levels, not yet in elems */
    uint32_t *alts;   /* (n_alts) where each alternative starts in elems */
    uint32_t n_alts, cap_alts;
    rule_info *rules; /* (n_rules) */
    uint32_t n_rules, cap_rules;
    uint64_t (*sets)[4]; /* (n_sets) distinct byte sets */
    uint32_t n_sets, cap_sets;
    uint32_t *set_slots; /* (cap_set_slots) set index + 1 by hash, at most half full */
    uint32_t cap_set_slots;
    uint32_t *name_slots; /* (cap_name_slots) named rule index + 1 by hash, at most half full */
    uint32_t cap_name_slots, n_names;
    cp_range *ranges; /* (n_ranges) the class being read */
    uint32_t n_ranges, cap_ranges;
    class_part *parts; /* (n_parts) its byte-level parts */
    uint32_t n_parts, cap_parts;
    uint32_t any_item[8]; /* (n_any_item) '.' once made: its elements (a reference to its
                             rule) */
    uint32_t n_any_item;
    level levels[GRAMMAR_NESTING_MAX + 1]; /* the rule and the groups being read, by depth */
    level class_level; /* a class's alternatives, when it makes a rule of its own */
} parser;

static void line_col(const parser *p, size_t at, unsigned *line, unsigned *col)
{
    *line = 1, *col = 1;
    for (size_t i = 0; i < at && i < p->len; i++) {
        unsigned char c = (unsigned char)p->text[i];
        if (c == '\n' || (c == '\r' && (i + 1 >= p->len || p->text[i + 1] != '\n')))
            (*line)++, *col = 1;
        else if ((c & 0xC0) != 0x80 && c != '\r')
            (*col)++;
    }
}

/* Fails with fmt's message and the line:column of text offset at. */
__attribute__((format(printf, 3, 4))) static int fail_at(parser *p, size_t at, const char *fmt,
                                                         ...)
{
    char what[ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    unsigned line, col;
    line_col(p, at, &line, &col);
    return err_set(p->err, "grammar: %s at %u:%u", what, line, col);
}

static int oom(parser *p)
{
    return err_set(p->err, "grammar: out of memory");
}

static char peek_at(const parser *p, size_t k)
{
    return p->pos + k < p->len ? p->text[p->pos + k] : '\0';
}

static char peek(const parser *p)
{
    return peek_at(p, 0);
}

static bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_';
}

/* Spaces, tabs and comments; newlines too where a rule goes on across them. */
static void skip_space(parser *p, bool newlines)
{
    for (;;) {
        char c = peek(p);
        if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r')))
            p->pos++;
        else if (c == '#')
            while (p->pos < p->len && peek(p) != '\n' && peek(p) != '\r')
                p->pos++;
        else
            return;
    }
}

static uint32_t hash_bytes(const void *data, size_t n)
{
    const unsigned char *b = data;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 16777619u;
    return h;
}

/* Doubles an open-addressed table of ids (index + 1) whose keys' hashes key_hash gives. */
static int slots_grow(parser *p, uint32_t **slots, uint32_t *cap,
                      uint32_t (*key_hash)(const parser *, uint32_t))
{
    uint32_t n = *cap ? *cap * 2 : 64;
    uint32_t *t = calloc(n, sizeof *t);
    if (!t)
        return oom(p);
    for (uint32_t i = 0; i < *cap; i++) {
        uint32_t id = (*slots)[i];
        if (!id)
            continue;
        uint32_t j = key_hash(p, id - 1) & (n - 1);
        while (t[j])
            j = (j + 1) & (n - 1);
        t[j] = id;
    }
    free(*slots);
    *slots = t;
    *cap = n;
    return 0;
}

static uint32_t set_hash(const parser *p, uint32_t id)
{
    return hash_bytes(p->sets[id], sizeof p->sets[id]);
}

static uint32_t name_hash(const parser *p, uint32_t id)
{
    return hash_bytes(p->text + p->rules[id].name, p->rules[id].name_len);
}

/* The index of byte set s, added when new. */
static int intern_set(parser *p, const uint64_t s[4], uint32_t *id)
{
    if (2 * (p->n_sets + 1) > p->cap_set_slots &&
        slots_grow(p, &p->set_slots, &p->cap_set_slots, set_hash))
        return -1;
    uint32_t mask = p->cap_set_slots - 1, i = hash_bytes(s, sizeof(uint64_t[4])) & mask;
    for (; p->set_slots[i]; i = (i + 1) & mask)
        if (memcmp(p->sets[p->set_slots[i] - 1], s, sizeof(uint64_t[4])) == 0) {
            *id = p->set_slots[i] - 1;
            return 0;
        }
    if (arraygrow((void **)&p->sets, &p->cap_sets, p->n_sets, sizeof *p->sets, 1))
        return oom(p);
    memcpy(p->sets[p->n_sets], s, sizeof(uint64_t[4]));
    p->set_slots[i] = ++p->n_sets;
    *id = p->n_sets - 1;
    return 0;
}

static void bits_range(uint64_t s[4], unsigned lo, unsigned hi)
{
    for (unsigned b = lo; b <= hi; b++)
        s[b >> 6] |= 1ull << (b & 63);
}

static int new_rule(parser *p, uint8_t kind, size_t at, uint32_t *id)
{
    if (p->n_rules == GRAMMAR_RULES_MAX)
        return fail_at(p, p->pos, "more than GRAMMAR_RULES_MAX (%d) rules", GRAMMAR_RULES_MAX);
    if (arraygrow((void **)&p->rules, &p->cap_rules, p->n_rules, sizeof *p->rules, 1))
        return oom(p);
    p->rules[p->n_rules] = (rule_info){.at = (uint32_t)at, .used_at = NONE, .kind = kind};
    *id = p->n_rules++;
    return 0;
}

/* The named rule text[at, at + n): found, or added undefined. */
static int named_rule(parser *p, size_t at, size_t n, uint32_t *id)
{
    if (2 * (p->n_names + 1) > p->cap_name_slots &&
        slots_grow(p, &p->name_slots, &p->cap_name_slots, name_hash))
        return -1;
    uint32_t mask = p->cap_name_slots - 1, i = hash_bytes(p->text + at, n) & mask;
    for (; p->name_slots[i]; i = (i + 1) & mask) {
        const rule_info *r = &p->rules[p->name_slots[i] - 1];
        if (r->name_len == n && memcmp(p->text + r->name, p->text + at, n) == 0) {
            *id = p->name_slots[i] - 1;
            return 0;
        }
    }
    if (new_rule(p, R_NAMED, at, id))
        return -1;
    p->rules[*id].name = (uint32_t)at;
    p->rules[*id].name_len = (uint32_t)n;
    p->name_slots[i] = *id + 1;
    p->n_names++;
    return 0;
}

/* Room for more elements, within GRAMMAR_ELEMENTS_MAX for all of them. */
static int elements_room(parser *p, uint32_t more)
{
    if ((uint64_t)p->n_elems + p->pending + more + 2 > GRAMMAR_ELEMENTS_MAX)
        return fail_at(p, p->pos, "more than GRAMMAR_ELEMENTS_MAX (%d) elements",
                       GRAMMAR_ELEMENTS_MAX);
    return 0;
}

static int push(parser *p, level *lv, uint32_t e)
{
    if (elements_room(p, 1))
        return -1;
    if (arraygrow((void **)&lv->e, &lv->cap, lv->n, sizeof *lv->e, 1))
        return oom(p);
    lv->e[lv->n++] = e;
    p->pending++;
    return 0;
}

static int push_set(parser *p, level *lv, const uint64_t s[4])
{
    uint32_t id = 0;
    if (intern_set(p, s, &id))
        return -1;
    return push(p, lv, ELEM(E_SET, id));
}

/* Drops the elements of lv from index n on. */
static void truncate_level(parser *p, level *lv, uint32_t n)
{
    p->pending -= lv->n - n;
    lv->n = n;
}

/* Gives rule r the n_alts alternatives in e[0..n) (each ended by E_END). */
static int define_rule(parser *p, uint32_t r, const uint32_t *e, uint32_t n, uint32_t n_alts)
{
    if (elements_room(p, n))
        return -1;
    if (arraygrow((void **)&p->elems, &p->cap_elems, p->n_elems, sizeof *p->elems, n) ||
        arraygrow((void **)&p->alts, &p->cap_alts, p->n_alts, sizeof *p->alts, n_alts))
        return oom(p);
    p->rules[r].first_alt = p->n_alts;
    p->rules[r].n_alts = n_alts;
    for (uint32_t i = 0; i < n; i++)
        if (i == 0 || KIND(e[i - 1]) == E_END)
            p->alts[p->n_alts++] = p->n_elems + i;
    memcpy(p->elems + p->n_elems, e, sizeof *e * n);
    p->n_elems += n;
    return 0;
}

/* Makes the alternatives of lv rule r, and empties lv. */
static int finish_level(parser *p, level *lv, uint32_t r)
{
    if (define_rule(p, r, lv->e, lv->n, lv->n_alts))
        return -1;
    truncate_level(p, lv, 0);
    return 0;
}

/* A character of a literal or a class at p->pos: an escape or a UTF-8 character (the
 * text is valid UTF-8, checked first). */
static int parse_char(parser *p, uint32_t *cp)
{
    size_t at = p->pos;
    const unsigned char *u = (const unsigned char *)p->text + at;
    if (u[0] != '\\') {
        int k = utf8_seq(p->text + at, p->len - at);
        uint32_t v = k == 1 ? u[0] : k == 2 ? u[0] & 0x1Fu : k == 3 ? u[0] & 0x0Fu : u[0] & 0x07u;
        for (int i = 1; i < k; i++)
            v = v << 6 | (u[i] & 0x3Fu);
        *cp = v;
        p->pos += (size_t)k;
        return 0;
    }
    char e = peek_at(p, 1);
    int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    if (digits) {
        uint32_t v = 0;
        for (int i = 0; i < digits; i++) {
            char h = peek_at(p, 2 + (size_t)i);
            int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                                   : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
            if (d < 0)
                return fail_at(p, at, "'\\%c' needs %d hex digits", e, digits);
            v = v << 4 | (uint32_t)d;
        }
        if (v > CP_MAX)
            return fail_at(p, at, "U+%X is past U+10FFFF", v);
        if (v >= 0xD800 && v <= 0xDFFF)
            return fail_at(p, at, "surrogate U+%04X", v);
        *cp = v;
        p->pos += 2 + (size_t)digits;
        return 0;
    }
    static const char plain[] = "\\\"[]-^", named[] = "ntr", meant[] = "\n\t\r";
    if (e && strchr(plain, e)) {
        *cp = (unsigned char)e;
    } else if (e && strchr(named, e)) {
        *cp = (unsigned char)meant[strchr(named, e) - named];
    } else if (!e) {
        return fail_at(p, at, "unfinished escape");
    } else {
        int k = utf8_seq(p->text + at + 1, p->len - at - 1);
        return fail_at(p, at, "unknown escape '\\%.*s'", k, p->text + at + 1);
    }
    p->pos += 2;
    return 0;
}

static int parse_literal(parser *p, level *lv)
{
    size_t open = p->pos++;
    while (peek(p) != '"') {
        if (p->pos >= p->len)
            return fail_at(p, open, "unclosed string");
        uint32_t cp;
        char b[4];
        if (parse_char(p, &cp))
            return -1;
        size_t n = utf8_encode(cp, b);
        for (size_t i = 0; i < n; i++) {
            uint64_t s[4] = {0};
            bits_range(s, (uint8_t)b[i], (uint8_t)b[i]);
            if (push_set(p, lv, s))
                return -1;
        }
    }
    p->pos++;
    return 0;
}

static int range_order(const void *a, const void *b)
{
    uint32_t x = ((const cp_range *)a)->lo, y = ((const cp_range *)b)->lo;
    return x < y ? -1 : x > y;
}

/* Parts with the same bytes after the first sort together. */
static int part_order(const void *a, const void *b)
{
    const class_part *x = a, *y = b;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    int c = memcmp(x->lo, y->lo, x->len - 1u);
    return c ? c : memcmp(x->hi, y->hi, x->len - 1u);
}

static int add_part(parser *p, uint32_t lo, uint32_t hi)
{
    utf8_range r[UTF8_RANGES_MAX];
    int n = utf8_ranges(lo, hi, r);
    if (arraygrow((void **)&p->parts, &p->cap_parts, p->n_parts, sizeof *p->parts, (uint32_t)n))
        return oom(p);
    for (int k = 0; k < n; k++) {
        class_part *c = &p->parts[p->n_parts++];
        memset(c, 0, sizeof *c);
        c->len = r[k].len;
        bits_range(c->first, r[k].lo[0], r[k].hi[0]);
        memcpy(c->lo, r[k].lo + 1, r[k].len - 1u);
        memcpy(c->hi, r[k].hi + 1, r[k].len - 1u);
    }
    return 0;
}

/* The characters of the sorted, disjoint ranges p->ranges (no surrogates among them) as
 * byte-level alternatives: parts with the same bytes after the first are one alternative
 * whose first byte set is their union. One alternative goes into lv as it is; several
 * become a rule of their own, kind made at `at`. */
static int push_chars(parser *p, level *lv, uint8_t kind, size_t at)
{
    p->n_parts = 0;
    for (uint32_t i = 0; i < p->n_ranges; i++)
        if (add_part(p, p->ranges[i].lo, p->ranges[i].hi))
            return -1;
    qsort(p->parts, p->n_parts, sizeof *p->parts, part_order);
    uint32_t n_groups = 0;
    for (uint32_t i = 0; i < p->n_parts; i++) {
        class_part *g = &p->parts[n_groups];
        if (i > 0 && part_order(g - 1, &p->parts[i]) == 0) {
            for (int w = 0; w < 4; w++)
                g[-1].first[w] |= p->parts[i].first[w];
        } else {
            *g = p->parts[i];
            n_groups++;
        }
    }
    bool own_rule = n_groups > 1;
    level *into = lv;
    if (own_rule) {
        into = &p->class_level;
        truncate_level(p, into, 0);
        into->n_alts = 0;
    }
    for (uint32_t i = 0; i < n_groups; i++) {
        const class_part *g = &p->parts[i];
        if (push_set(p, into, g->first))
            return -1;
        for (int k = 0; k + 1 < g->len; k++) {
            uint64_t s[4] = {0};
            bits_range(s, g->lo[k], g->hi[k]);
            if (push_set(p, into, s))
                return -1;
        }
        if (own_rule && push(p, into, ELEM(E_END, 0)))
            return -1;
        into->n_alts += own_rule;
    }
    if (!own_rule)
        return 0;
    uint32_t r;
    return new_rule(p, kind, at, &r) || finish_level(p, into, r) || push(p, lv, ELEM(E_REF, r))
               ? -1
               : 0;
}

/* Sorts and merges p->ranges, negates them if asked, and takes the surrogates out. */
static int normalise_ranges(parser *p, bool negated)
{
    qsort(p->ranges, p->n_ranges, sizeof *p->ranges, range_order);
    uint32_t n = 0;
    for (uint32_t i = 0; i < p->n_ranges; i++) {
        if (n > 0 && p->ranges[i].lo <= p->ranges[n - 1].hi + 1) {
            if (p->ranges[i].hi > p->ranges[n - 1].hi)
                p->ranges[n - 1].hi = p->ranges[i].hi;
        } else {
            p->ranges[n++] = p->ranges[i];
        }
    }
    p->n_ranges = n;
    /* the complement, then the surrogates cut out: at most two ranges more */
    if (arraygrow((void **)&p->ranges, &p->cap_ranges, p->n_ranges, sizeof *p->ranges, 2))
        return oom(p);
    if (negated) {
        uint32_t from = 0, k = 0;
        for (uint32_t i = 0; i < n; i++) {
            cp_range r = p->ranges[i];
            if (r.lo > from)
                p->ranges[k++] = (cp_range){from, r.lo - 1};
            from = r.hi + 1;
        }
        if (from <= CP_MAX)
            p->ranges[k++] = (cp_range){from, CP_MAX};
        p->n_ranges = n = k;
    }
    uint32_t k = 0;
    cp_range out[2];
    for (uint32_t i = 0; i < n; i++) {
        cp_range r = p->ranges[i];
        int m = 0;
        if (r.lo < 0xD800)
            out[m++] = (cp_range){r.lo, r.hi < 0xD800 ? r.hi : 0xD7FF};
        if (r.hi > 0xDFFF)
            out[m++] = (cp_range){r.lo > 0xDFFF ? r.lo : 0xE000, r.hi};
        /* a range may split in two: the rest moves up one */
        if (m == 2) {
            memmove(p->ranges + i + 2, p->ranges + i + 1, sizeof *p->ranges * (n - i - 1));
            n++, i++;
        }
        for (int j = 0; j < m; j++)
            p->ranges[k++] = out[j];
    }
    p->n_ranges = k;
    return 0;
}

static int add_range(parser *p, uint32_t lo, uint32_t hi)
{
    if (arraygrow((void **)&p->ranges, &p->cap_ranges, p->n_ranges, sizeof *p->ranges, 1))
        return oom(p);
    p->ranges[p->n_ranges++] = (cp_range){lo, hi};
    return 0;
}

static int parse_class(parser *p, level *lv)
{
    size_t open = p->pos++;
    bool negated = peek(p) == '^';
    p->pos += negated;
    p->n_ranges = 0;
    while (peek(p) != ']') {
        if (p->pos >= p->len)
            return fail_at(p, open, "unclosed class");
        size_t at = p->pos;
        uint32_t lo, hi;
        if (parse_char(p, &lo))
            return -1;
        hi = lo;
        if (peek(p) == '-' && peek_at(p, 1) != ']') {
            if (p->pos + 1 >= p->len)
                return fail_at(p, open, "unclosed class");
            p->pos++;
            if (parse_char(p, &hi))
                return -1;
            if (hi < lo)
                return fail_at(p, at, "range out of order");
        }
        if (add_range(p, lo, hi))
            return -1;
    }
    p->pos++;
    if (p->n_ranges == 0)
        return fail_at(p, open, "empty class");
    if (normalise_ranges(p, negated))
        return -1;
    if (p->n_ranges == 0)
        return fail_at(p, open, "class matches no character");
    return push_chars(p, lv, R_CLASS, open);
}

/* '.': every character; its elements are made once and pushed again after. */
static int parse_any(parser *p, level *lv)
{
    size_t at = p->pos++;
    if (p->n_any_item == 0) {
        uint32_t from = lv->n;
        p->n_ranges = 0;
        if (add_range(p, 0, CP_MAX) || normalise_ranges(p, false) ||
            push_chars(p, lv, R_CLASS, at))
            return -1;
        p->n_any_item = lv->n - from;
        memcpy(p->any_item, lv->e + from, sizeof *lv->e * p->n_any_item);
        return 0;
    }
    for (uint32_t i = 0; i < p->n_any_item; i++)
        if (push(p, lv, p->any_item[i]))
            return -1;
    return 0;
}

/* Repeats the last item of lv from min to max times (max NONE: no bound), as llama.cpp
 * rewrites repetitions: min copies, then for no bound R ::= x R | "", else a chain of
 * max - min optional copies, each O(k) ::= x O(k - 1) | "". op is the operator's text at
 * `at`. */
static int repeat(parser *p, level *lv, uint32_t min, uint32_t max, size_t at, const char *op)
{
    if (lv->item == NONE)
        return fail_at(p, at, "'%s' repeats nothing", op);
    uint32_t x, r;
    if (lv->n - lv->item == 1) {
        x = lv->e[lv->item];
    } else {
        /* several elements (a literal's bytes, a group's sequence): a rule of their own */
        uint32_t n = lv->n - lv->item;
        if (new_rule(p, R_GROUP, at, &r) || push(p, lv, ELEM(E_END, 0)) ||
            define_rule(p, r, lv->e + lv->item, n + 1, 1))
            return -1;
        x = ELEM(E_REF, r);
    }
    truncate_level(p, lv, lv->item);
    for (uint32_t i = 0; i < min; i++)
        if (push(p, lv, x))
            return -1;
    /* R ::= x R | "" for no bound; else O(k) ::= x O(k - 1) | "", the first x | "" */
    uint32_t prev = NONE, optional = max == NONE ? 1 : max - min;
    for (uint32_t k = 0; k < optional; k++) {
        uint32_t e[4], n = 0;
        if (new_rule(p, R_REPEAT, at, &r))
            return -1;
        e[n++] = x;
        if (max == NONE || prev != NONE)
            e[n++] = ELEM(E_REF, max == NONE ? r : prev);
        e[n++] = ELEM(E_END, 0);
        e[n++] = ELEM(E_END, 0);
        if (define_rule(p, r, e, n, 2))
            return -1;
        prev = r;
    }
    return prev == NONE ? 0 : push(p, lv, ELEM(E_REF, prev));
}

/* A count of a repetition: digits, at most GRAMMAR_REPEAT_MAX. */
static int parse_count(parser *p, uint32_t *v)
{
    size_t at = p->pos;
    *v = 0;
    while (peek(p) >= '0' && peek(p) <= '9') {
        *v = *v * 10 + (uint32_t)(peek(p) - '0');
        if (*v > GRAMMAR_REPEAT_MAX)
            return fail_at(p, at, "count past GRAMMAR_REPEAT_MAX (%d)", GRAMMAR_REPEAT_MAX);
        p->pos++;
    }
    return 0;
}

static int parse_bounds(parser *p, level *lv, bool nested)
{
    size_t open = p->pos++;
    uint32_t min, max;
    skip_space(p, nested);
    if (!(peek(p) >= '0' && peek(p) <= '9'))
        return fail_at(p, p->pos, "expected a count");
    if (parse_count(p, &min))
        return -1;
    skip_space(p, nested);
    if (peek(p) == '}') {
        max = min;
    } else if (peek(p) == ',') {
        p->pos++;
        skip_space(p, nested);
        max = NONE;
        if (peek(p) >= '0' && peek(p) <= '9') {
            if (parse_count(p, &max))
                return -1;
            skip_space(p, nested);
        }
        if (peek(p) != '}')
            return fail_at(p, p->pos, "expected '}'");
    } else {
        return fail_at(p, p->pos, "expected ',' or '}'");
    }
    p->pos++;
    if (max != NONE && max < min)
        return fail_at(p, open, "repetition {%u,%u} out of order", min, max);
    return repeat(p, lv, min, max, open, "{");
}

static int parse_alternates(parser *p, int depth, bool nested);

/* ( alternatives ): one alternative is spliced into the sequence, several make a rule. */
static int parse_group(parser *p, int depth, level *lv)
{
    size_t open = p->pos++;
    if (depth + 1 > GRAMMAR_NESTING_MAX)
        return fail_at(p, open, "parentheses nested deeper than %d", GRAMMAR_NESTING_MAX);
    skip_space(p, true);
    if (parse_alternates(p, depth + 1, true))
        return -1;
    if (peek(p) != ')')
        return fail_at(p, open, "unclosed '('");
    p->pos++;
    level *in = &p->levels[depth + 1];
    if (in->n_alts == 1) {
        for (uint32_t i = 0; i + 1 < in->n; i++)
            if (push(p, lv, in->e[i]))
                return -1;
        truncate_level(p, in, 0);
        return 0;
    }
    uint32_t r;
    return new_rule(p, R_GROUP, open, &r) || finish_level(p, in, r) ||
                   push(p, lv, ELEM(E_REF, r))
               ? -1
               : 0;
}

static int parse_sequence(parser *p, int depth, bool nested)
{
    level *lv = &p->levels[depth];
    lv->item = NONE;
    for (;;) {
        char c = peek(p);
        size_t at = p->pos;
        uint32_t start = lv->n;
        int rc;
        if (c == '"') {
            rc = parse_literal(p, lv);
        } else if (c == '[') {
            rc = parse_class(p, lv);
        } else if (c == '.') {
            rc = parse_any(p, lv);
        } else if (c == '(') {
            rc = parse_group(p, depth, lv);
        } else if (name_char(c)) {
            while (name_char(peek(p)))
                p->pos++;
            uint32_t r;
            if (named_rule(p, at, p->pos - at, &r))
                return -1;
            if (p->rules[r].used_at == NONE)
                p->rules[r].used_at = (uint32_t)at;
            rc = push(p, lv, ELEM(E_REF, r));
        } else if (c == '*' || c == '+' || c == '?') {
            p->pos++;
            if (repeat(p, lv, c == '+', c == '?' ? 1 : NONE, at, c == '*' ? "*" : c == '+' ? "+" : "?"))
                return -1;
            skip_space(p, nested);
            continue;
        } else if (c == '{') {
            if (parse_bounds(p, lv, nested))
                return -1;
            skip_space(p, nested);
            continue;
        } else if (c == '<') {
            return fail_at(p, at, "token references (<...>) are not supported");
        } else {
            return 0;
        }
        if (rc)
            return -1;
        lv->item = start;
        skip_space(p, nested);
    }
}

static int parse_alternates(parser *p, int depth, bool nested)
{
    level *lv = &p->levels[depth];
    truncate_level(p, lv, 0);
    lv->n_alts = 0;
    for (;;) {
        if (parse_sequence(p, depth, nested) || push(p, lv, ELEM(E_END, 0)))
            return -1;
        lv->n_alts++;
        if (peek(p) != '|')
            return 0;
        p->pos++;
        skip_space(p, true);
    }
}

static int parse_rule(parser *p)
{
    size_t at = p->pos;
    while (name_char(peek(p)))
        p->pos++;
    size_t n = p->pos - at;
    if (n == 0)
        return fail_at(p, at, "expected a rule name");
    skip_space(p, false);
    if (p->pos + 3 > p->len || memcmp(p->text + p->pos, "::=", 3) != 0)
        return fail_at(p, p->pos, "expected '::=' after '%.*s'", (int)n, p->text + at);
    p->pos += 3;
    skip_space(p, true);
    uint32_t r;
    if (named_rule(p, at, n, &r))
        return -1;
    if (p->rules[r].defined) {
        unsigned l1, c1, l2, c2;
        line_col(p, p->rules[r].at, &l1, &c1);
        line_col(p, at, &l2, &c2);
        return err_set(p->err, "grammar: rule '%.*s' defined twice, at %u:%u and %u:%u", (int)n,
                       p->text + at, l1, c1, l2, c2);
    }
    p->rules[r].defined = true;
    p->rules[r].at = (uint32_t)at;
    if (parse_alternates(p, 0, false) || finish_level(p, &p->levels[0], r))
        return -1;
    char c = peek(p);
    if (c == '\r' || c == '\n') {
        p->pos += c == '\r' && peek_at(p, 1) == '\n' ? 2 : 1;
    } else if (c == ')') {
        return fail_at(p, p->pos, "unmatched ')'");
    } else if (p->pos < p->len) {
        int k = utf8_seq(p->text + p->pos, p->len - p->pos);
        return fail_at(p, p->pos, "unexpected '%.*s'", k, p->text + p->pos);
    }
    skip_space(p, true);
    return 0;
}

/* ---- checks over the rules ---- */

/* A rule, for messages: its name, or what made it and where. */
static void describe(const parser *p, uint32_t r, char *out, size_t cap)
{
    const rule_info *ri = &p->rules[r];
    unsigned line, col;
    line_col(p, ri->at, &line, &col);
    static const char *const made[] = {"", "the group", "the repetition", "the class"};
    if (ri->kind == R_NAMED)
        snprintf(out, cap, "rule '%.*s' at %u:%u", (int)ri->name_len, p->text + ri->name, line, col);
    else
        snprintf(out, cap, "%s at %u:%u", made[ri->kind], line, col);
}

/* For every rule, whether it matches the empty text (nullable) or some text at all
 * (productive): an alternative counts once none of its elements is pending, a byte set
 * pending for ever when nullable is asked, a reference until its rule counts. Worklist:
 * each rule found counts down the alternatives that refer to it. out[r] is 1 for yes. */
static int fixpoint(parser *p, bool nullable, uint8_t *out)
{
    uint32_t n_alts = p->n_alts, n_rules = p->n_rules, n_refs = 0;
    uint32_t *pending = calloc(n_alts ? n_alts : 1, sizeof *pending);
    uint32_t *alt_rule = malloc(sizeof *alt_rule * (n_alts ? n_alts : 1));
    uint32_t *first = calloc((size_t)n_rules + 1, sizeof *first);
    uint32_t *fill = malloc(sizeof *fill * (n_rules ? n_rules : 1));
    uint32_t *users = NULL, *queue = malloc(sizeof *queue * (n_rules ? n_rules : 1));
    int rc = -1;
    if (!pending || !alt_rule || !first || !fill || !queue)
        goto done;
    memset(out, 0, n_rules);
    /* per alternative its pending elements; per rule its references (first[r + 1] first) */
    for (uint32_t r = 0; r < n_rules; r++)
        for (uint32_t a = p->rules[r].first_alt; a < p->rules[r].first_alt + p->rules[r].n_alts; a++) {
            alt_rule[a] = r;
            for (uint32_t i = p->alts[a]; KIND(p->elems[i]) != E_END; i++) {
                uint32_t e = p->elems[i];
                if (KIND(e) == E_REF) {
                    pending[a]++;
                    first[ARG(e) + 1]++;
                    n_refs++;
                } else if (nullable) {
                    pending[a] = NONE / 2; /* never counts down to 0 */
                }
            }
        }
    /* rule r's users (one alternative per reference to r) are users[first[r], first[r + 1]) */
    if (!(users = malloc(sizeof *users * (n_refs ? n_refs : 1))))
        goto done;
    for (uint32_t r = 0; r < n_rules; r++) {
        first[r + 1] += first[r];
        fill[r] = first[r];
    }
    for (uint32_t a = 0; a < n_alts; a++)
        for (uint32_t i = p->alts[a]; KIND(p->elems[i]) != E_END; i++)
            if (KIND(p->elems[i]) == E_REF)
                users[fill[ARG(p->elems[i])]++] = a;
    uint32_t head = 0, tail = 0;
    for (uint32_t a = 0; a < n_alts; a++)
        if (pending[a] == 0 && !out[alt_rule[a]]) {
            out[alt_rule[a]] = 1;
            queue[tail++] = alt_rule[a];
        }
    while (head < tail) {
        uint32_t r = queue[head++];
        for (uint32_t k = first[r]; k < first[r + 1]; k++) {
            uint32_t a = users[k];
            if (--pending[a] == 0 && !out[alt_rule[a]]) {
                out[alt_rule[a]] = 1;
                queue[tail++] = alt_rule[a];
            }
        }
    }
    rc = 0;
done:
    free(pending);
    free(alt_rule);
    free(first);
    free(fill);
    free(users);
    free(queue);
    return rc ? oom(p) : 0;
}

/* The rules a rule can begin with (its left edges): in each alternative, the references
 * up to the first element that cannot match the empty text. Compressed: rule r's are
 * to[from[r], from[r + 1]). */
static int left_edges(parser *p, const uint8_t *nullable, uint32_t **from, uint32_t **to)
{
    uint32_t n = 0;
    *from = calloc((size_t)p->n_rules + 1, sizeof **from);
    *to = NULL;
    if (!*from)
        return oom(p);
    for (int pass = 0; pass < 2; pass++) {
        n = 0;
        for (uint32_t r = 0; r < p->n_rules; r++) {
            (*from)[r] = n;
            for (uint32_t a = p->rules[r].first_alt; a < p->rules[r].first_alt + p->rules[r].n_alts; a++)
                for (uint32_t i = p->alts[a]; KIND(p->elems[i]) == E_REF; i++) {
                    if (pass)
                        (*to)[n] = ARG(p->elems[i]);
                    n++;
                    if (!nullable[ARG(p->elems[i])])
                        break;
                }
        }
        (*from)[p->n_rules] = n;
        if (!pass && !(*to = malloc(sizeof **to * (n ? n : 1))))
            return oom(p);
    }
    return 0;
}

/* Refuses a rule that can begin with itself: a cycle of left edges, found depth first. */
static int check_left_recursion(parser *p, const uint8_t *nullable)
{
    uint32_t *from, *to;
    if (left_edges(p, nullable, &from, &to)) {
        free(from);
        return -1;
    }
    uint8_t *color = calloc(p->n_rules ? p->n_rules : 1, 1); /* 1 on the path, 2 done */
    uint32_t *path = malloc(sizeof *path * (p->n_rules ? p->n_rules : 1));
    uint32_t *next = malloc(sizeof *next * (p->n_rules ? p->n_rules : 1));
    int rc = 0;
    if (!color || !path || !next) {
        rc = oom(p);
        goto done;
    }
    for (uint32_t root = 0; root < p->n_rules && !rc; root++) {
        if (color[root])
            continue;
        uint32_t depth = 0;
        path[depth] = root, next[depth++] = from[root], color[root] = 1;
        while (depth && !rc) {
            uint32_t r = path[depth - 1];
            if (next[depth - 1] == from[r + 1]) {
                color[r] = 2;
                depth--;
                continue;
            }
            uint32_t s = to[next[depth - 1]++];
            if (color[s] == 0) {
                path[depth] = s, next[depth++] = from[s], color[s] = 1;
                continue;
            }
            if (color[s] == 2)
                continue;
            /* a cycle: path from s to the top, back to s */
            uint32_t first = depth - 1;
            while (path[first] != s)
                first--;
            uint32_t named = NONE, rep = NONE;
            for (uint32_t i = first; i < depth; i++) {
                if (named == NONE && p->rules[path[i]].kind == R_NAMED)
                    named = i;
                if (rep == NONE && p->rules[path[i]].kind == R_REPEAT)
                    rep = i;
            }
            char d[96];
            if (named == NONE) {
                describe(p, path[rep], d, sizeof d);
                rc = err_set(p->err, "grammar: left recursion: %s repeats what can match the "
                             "empty text", d);
                break;
            }
            /* the named rules of the cycle, from the first of them round to it again */
            char chain[160];
            size_t k = 0;
            uint32_t len = depth - first;
            for (uint32_t j = 0; j <= len && k < sizeof chain; j++) {
                const rule_info *ri = &p->rules[path[first + (named - first + j) % len]];
                if (ri->kind == R_NAMED)
                    k += (size_t)snprintf(chain + k, sizeof chain - k, "%s'%.*s'", k ? " -> " : "",
                                          (int)ri->name_len, p->text + ri->name);
            }
            const rule_info *ri = &p->rules[path[named]];
            unsigned line, col;
            line_col(p, ri->at, &line, &col);
            rc = err_set(p->err, "grammar: left recursion: rule '%.*s' can begin with itself "
                         "(%s) at %u:%u", (int)ri->name_len, p->text + ri->name, chain, line, col);
        }
    }
done:
    free(from);
    free(to);
    free(color);
    free(path);
    free(next);
    return rc;
}

/* Refuses a rule that root uses and that can never finish: the last named one found
 * breadth first from root (a rule that never finishes makes every rule using it
 * unfinishable too: the last is nearest the cause). */
static int check_finishing(parser *p, uint32_t root, const uint8_t *productive)
{
    uint8_t *seen = calloc(p->n_rules ? p->n_rules : 1, 1);
    uint32_t *queue = malloc(sizeof *queue * (p->n_rules ? p->n_rules : 1));
    if (!seen || !queue) {
        free(seen);
        free(queue);
        return oom(p);
    }
    uint32_t head = 0, tail = 0, bad = NONE, bad_any = NONE;
    queue[tail++] = root;
    seen[root] = 1;
    while (head < tail) {
        uint32_t r = queue[head++];
        if (!productive[r]) {
            bad_any = r;
            if (p->rules[r].kind == R_NAMED)
                bad = r;
        }
        const rule_info *ri = &p->rules[r];
        for (uint32_t a = ri->first_alt; a < ri->first_alt + ri->n_alts; a++)
            for (uint32_t i = p->alts[a]; KIND(p->elems[i]) != E_END; i++)
                if (KIND(p->elems[i]) == E_REF && !seen[ARG(p->elems[i])]) {
                    seen[ARG(p->elems[i])] = 1;
                    queue[tail++] = ARG(p->elems[i]);
                }
    }
    free(seen);
    free(queue);
    if (bad_any == NONE)
        return 0;
    char d[96];
    describe(p, bad != NONE ? bad : bad_any, d, sizeof d);
    return err_set(p->err, "grammar: %s never finishes (each of its alternatives goes on for ever)",
                   d);
}

static int key_order(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The length of the common prefix of alternatives alts[first + (uint32_t)k[m]] for m in
 * [i, j), which begin alike: up to where two differ or one ends. */
static uint32_t common_prefix(const parser *p, uint32_t first, const uint64_t *k, uint32_t i,
                              uint32_t j)
{
    uint32_t a = p->alts[first + (uint32_t)k[i]], len = 1;
    for (;; len++) {
        uint32_t x = p->elems[a + len];
        if (x == ELEM(E_END, 0))
            return len;
        for (uint32_t m = i + 1; m < j; m++)
            if (p->elems[p->alts[first + (uint32_t)k[m]] + len] != x)
                return len;
    }
}

/* Merges the alternatives of rule r that begin with the same element: their common
 * prefix, then a new rule whose alternatives are what follows it in each (they start
 * inside the old ones: only the prefix is copied), merged in turn when left_factor comes
 * to it. keys: scratch. Skipped when the rules or elements would pass their bounds: it
 * only saves stacks. */
static int factor_rule(parser *p, uint32_t r, uint64_t **keys, uint32_t *cap_keys)
{
    uint32_t n = p->rules[r].n_alts, first = p->rules[r].first_alt;
    if (n < 2)
        return 0;
    if (arraygrow((void **)keys, cap_keys, 0, sizeof **keys, n))
        return oom(p);
    /* by first element (an empty alternative's is E_END, never merged), then in order */
    uint64_t *k = *keys;
    for (uint32_t i = 0; i < n; i++)
        k[i] = (uint64_t)p->elems[p->alts[first + i]] << 32 | i;
    qsort(k, n, sizeof *k, key_order);
    /* the groups: alternatives [i, j) of k alike; what merging them costs */
    uint32_t groups = 0, merged = 0;
    uint64_t elements = 0;
    for (uint32_t i = 0, j; i < n; i = j) {
        for (j = i + 1; j < n && k[j] >> 32 == k[i] >> 32 && k[i] >> 32 != ELEM(E_END, 0);)
            j++;
        if (j > i + 1) {
            groups++;
            merged += j - i;
            elements += common_prefix(p, first, k, i, j) + 2;
        }
    }
    if (!groups || p->n_rules + groups > GRAMMAR_RULES_MAX ||
        p->n_elems + elements > GRAMMAR_ELEMENTS_MAX)
        return 0;
    if (arraygrow((void **)&p->alts, &p->cap_alts, p->n_alts, sizeof *p->alts, 2 * n) ||
        arraygrow((void **)&p->rules, &p->cap_rules, p->n_rules, sizeof *p->rules, groups) ||
        arraygrow((void **)&p->elems, &p->cap_elems, p->n_elems, sizeof *p->elems,
                  (uint32_t)elements))
        return oom(p);
    /* r's alternatives (one per group) first, then each new rule's */
    uint32_t r_first = p->n_alts, n_r = 0;
    p->n_alts += n - merged + groups;
    for (uint32_t i = 0, j; i < n; i = j) {
        for (j = i + 1; j < n && k[j] >> 32 == k[i] >> 32 && k[i] >> 32 != ELEM(E_END, 0);)
            j++;
        uint32_t a = p->alts[first + (uint32_t)k[i]];
        if (j == i + 1) {
            p->alts[r_first + n_r++] = a;
            continue;
        }
        uint32_t len = common_prefix(p, first, k, i, j), nr = p->n_rules++;
        p->rules[nr] = (rule_info){.first_alt = p->n_alts, .n_alts = j - i, .at = p->rules[r].at,
                                   .used_at = NONE, .kind = R_GROUP};
        for (uint32_t m = i; m < j; m++)
            p->alts[p->n_alts++] = p->alts[first + (uint32_t)k[m]] + len;
        p->alts[r_first + n_r++] = p->n_elems;
        memcpy(p->elems + p->n_elems, p->elems + a, sizeof *p->elems * len);
        p->n_elems += len;
        p->elems[p->n_elems++] = ELEM(E_REF, nr);
        p->elems[p->n_elems++] = ELEM(E_END, 0);
    }
    p->rules[r].first_alt = r_first;
    p->rules[r].n_alts = n_r;
    return 0;
}

/* Left-factors every rule, the new ones too (see factor_rule): a list of a thousand words
 * (a JSON Schema enum, keywords) then needs a stack per distinct next byte, not per word. */
static int left_factor(parser *p)
{
    uint64_t *keys = NULL;
    uint32_t cap = 0;
    int rc = 0;
    for (uint32_t r = 0; r < p->n_rules && !rc; r++)
        rc = factor_rule(p, r, &keys, &cap);
    free(keys);
    return rc;
}

static void parser_free(parser *p)
{
    free(p->elems);
    free(p->alts);
    free(p->rules);
    free(p->sets);
    free(p->set_slots);
    free(p->name_slots);
    free(p->ranges);
    free(p->parts);
    for (int i = 0; i <= GRAMMAR_NESTING_MAX; i++)
        free(p->levels[i].e);
    free(p->class_level.e);
}

/* The whole text: valid UTF-8 without NUL bytes. */
static int check_text(parser *p)
{
    for (size_t i = 0; i < p->len;) {
        if (p->text[i] == '\0')
            return fail_at(p, i, "a NUL byte");
        int k = utf8_seq(p->text + i, p->len - i);
        if (k <= 0)
            return fail_at(p, i, "invalid UTF-8");
        i += (size_t)k;
    }
    return 0;
}

/* Checks the parsed rules and moves them into g (alternatives in rule order, the start
 * element after the rest). */
static int build(parser *p, grammar *g)
{
    if (p->n_names == 0)
        return err_set(p->err, "grammar: the text has no rules");
    for (uint32_t r = 0; r < p->n_rules; r++)
        if (p->rules[r].kind == R_NAMED && !p->rules[r].defined)
            return fail_at(p, p->rules[r].used_at, "undefined rule '%.*s'",
                           (int)p->rules[r].name_len, p->text + p->rules[r].name);
    uint32_t root = NONE;
    for (uint32_t r = 0; r < p->n_rules && root == NONE; r++)
        if (p->rules[r].kind == R_NAMED && p->rules[r].name_len == 4 &&
            memcmp(p->text + p->rules[r].name, "root", 4) == 0)
            root = r;
    if (root == NONE)
        return err_set(p->err, "grammar: no rule 'root' (where every sentence starts)");
    uint8_t *flags = malloc(p->n_rules);
    if (!flags)
        return oom(p);
    if (fixpoint(p, true, flags) || check_left_recursion(p, flags) ||
        fixpoint(p, false, flags) || check_finishing(p, root, flags)) {
        free(flags);
        return -1;
    }
    free(flags);
    /* after the checks, whose messages speak of the rules as written: merging keeps what
     * they found (no rule begins with itself, every rule can finish) */
    if (left_factor(p))
        return -1;
    uint32_t start[] = {ELEM(E_REF, root), ELEM(E_END, 0)};
    if (arraygrow((void **)&p->elems, &p->cap_elems, p->n_elems, sizeof *p->elems, 2))
        return oom(p);
    g->start = p->n_elems;
    memcpy(p->elems + p->n_elems, start, sizeof start);
    p->n_elems += 2;
    g->alts = malloc(sizeof *g->alts * (p->n_alts ? p->n_alts : 1));
    g->rule_alts = malloc(sizeof *g->rule_alts * ((size_t)p->n_rules + 1));
    if (!g->alts || !g->rule_alts)
        return oom(p);
    uint32_t n = 0;
    for (uint32_t r = 0; r < p->n_rules; r++) {
        g->rule_alts[r] = n;
        memcpy(g->alts + n, p->alts + p->rules[r].first_alt, sizeof *g->alts * p->rules[r].n_alts);
        n += p->rules[r].n_alts;
    }
    g->rule_alts[p->n_rules] = n;
    g->n_alts = n;
    g->n_rules = p->n_rules;
    g->elems = p->elems, g->n_elems = p->n_elems, p->elems = NULL;
    g->sets = p->sets, g->n_sets = p->n_sets, p->sets = NULL;
    return 0;
}

/* Refuses a grammar whose start alone passes the recogniser's bounds. */
static int check_start(const grammar *g, char err[ERR_MAX])
{
    work wk;
    stackset set = {.w = malloc(sizeof *set.w * SET_WORDS)};
    if (!set.w || work_init(&wk)) {
        free(set.w);
        return err_set(err, "grammar: out of memory");
    }
    int rc = start_set(g, &wk, &set);
    work_free(&wk);
    free(set.w);
    switch (rc) {
    case STEP_STACKS:
        return err_set(err, "grammar: its start needs more than GRAMMAR_STACKS_MAX (%d) parse "
                       "stacks", GRAMMAR_STACKS_MAX);
    case STEP_DEPTH:
        return err_set(err, "grammar: its start needs more than GRAMMAR_DEPTH_MAX (%d) positions "
                       "in a stack", GRAMMAR_DEPTH_MAX);
    case STEP_EXPAND:
        return err_set(err, "grammar: its start needs more than GRAMMAR_EXPAND_MAX (%d) "
                       "expansions", GRAMMAR_EXPAND_MAX);
    }
    return 0;
}

int grammar_compile(const char *text, size_t n, grammar **out, char err[ERR_MAX])
{
    char local[ERR_MAX];
    *out = NULL;
    if (!err)
        err = local;
    err[0] = '\0';
    if (n > GRAMMAR_TEXT_MAX)
        return err_set(err, "grammar: the text of %zu bytes passes GRAMMAR_TEXT_MAX (%d)", n,
                       GRAMMAR_TEXT_MAX);
    parser *p = calloc(1, sizeof *p);
    grammar *g = calloc(1, sizeof *g);
    if (!p || !g) {
        free(p);
        free(g);
        return err_set(err, "grammar: out of memory");
    }
    p->text = text, p->len = n, p->err = err;
    int rc = check_text(p);
    if (!rc) {
        skip_space(p, true);
        while (!rc && p->pos < p->len)
            rc = parse_rule(p);
    }
    if (!rc)
        rc = build(p, g);
    parser_free(p);
    free(p);
    if (!rc)
        rc = check_start(g, err);
    if (rc) {
        grammar_free(g);
        return -1;
    }
    *out = g;
    return 0;
}

void grammar_free(grammar *g)
{
    if (!g)
        return;
    free(g->elems);
    free(g->alts);
    free(g->rule_alts);
    free(g->sets);
    free(g);
}

/* ---- vocabularies ---- */

struct grammar_vocab {
    tok_pieces pieces; /* every token's bytes */
    uint8_t *eog;      /* (pieces.n_vocab) 1 for a token that ends generation */
};

int grammar_vocab_new(const tokenizer *t, grammar_vocab **out, char err[ERR_MAX])
{
    int32_t n = tok_n_vocab(t);
    grammar_vocab *v = calloc(1, sizeof *v);
    *out = NULL;
    if (!v || !(v->eog = calloc(n ? (size_t)n : 1, 1))) {
        free(v);
        return err_set(err, "grammar: out of memory for a vocabulary of %d tokens", (int)n);
    }
    if (tok_pieces_new(t, &v->pieces, err)) {
        grammar_vocab_free(v);
        return -1;
    }
    for (int32_t i = 0; i < n; i++)
        v->eog[i] = tok_is_eog(t, i);
    *out = v;
    return 0;
}

void grammar_vocab_free(grammar_vocab *v)
{
    if (!v)
        return;
    tok_pieces_free(&v->pieces);
    free(v->eog);
    free(v);
}

/* ---- cursors ---- */

/* The states a cursor may learn before it starts afresh, and their stacks' words. */
#define CACHE_STATES 1024 /* below ROW_REFUSED */
#define CACHE_WORDS (1u << 18)
#define CACHE_SLOTS (2 * CACHE_STATES)
/* A row's entries: the state after the byte plus 1, or these. */
#define ROW_UNKNOWN 0       /* the row is not filled yet, or the state is not in the table */
#define ROW_REFUSED 0xFFFFu /* the byte is refused (by the grammar, or for a bound) */

/* A set of stacks the cursor has met. */
typedef struct state {
    uint32_t off, used, n; /* its stacks: the cache's words[off, off + used), n of them */
    uint32_t key;          /* its stackset's hash and complete flag, mixed */
    bool complete;         /* an empty stack among them: a sentence ends here */
    bool ready;            /* ok, bounded and its row are filled (else its row is all
                              ROW_UNKNOWN) */
    bool bounded;          /* a byte its tops take is refused for a bound */
    uint64_t ok[4];        /* the bytes it takes */
} state;

/* Everything a cursor writes, its const queries too. */
typedef struct scratch {
    work wk;
    stackset sets[2];    /* steps' results, off the table */
    uint32_t *words;     /* (CACHE_WORDS) the states' stacks */
    uint32_t words_used;
    state *states;       /* (CACHE_STATES) */
    uint32_t n_states;
    uint16_t *rows;      /* (CACHE_STATES * 256) the state after each byte, plus 1, or
                            ROW_UNKNOWN or ROW_REFUSED */
    uint32_t *index;     /* (CACHE_SLOTS) state + 1 by key (0: empty) */
    uint32_t tops[GRAMMAR_STACKS_MAX]; /* a state's distinct top sets, while its row fills */
    uint64_t classes[256][4];          /* the classes of bytes they tell apart */
} scratch;

struct grammar_cursor {
    const grammar *g;
    const grammar_vocab *v;
    uint32_t cur; /* the state after the text so far */
    scratch *s;
};

static uint32_t state_key(const stackset *x)
{
    return x->hash * 2 + x->complete;
}

/* The state of stacks x: found, or added (-1 when the table is full). */
static int32_t intern(scratch *s, const stackset *x)
{
    uint32_t key = state_key(x), i = key & (CACHE_SLOTS - 1);
    for (; s->index[i]; i = (i + 1) & (CACHE_SLOTS - 1)) {
        const state *st = &s->states[s->index[i] - 1];
        if (st->key == key && st->used == x->used && st->n == x->n &&
            st->complete == x->complete &&
            memcmp(s->words + st->off, x->w, sizeof *x->w * x->used) == 0)
            return (int32_t)s->index[i] - 1;
    }
    if (s->n_states == CACHE_STATES || s->words_used + x->used > CACHE_WORDS)
        return -1;
    state *st = &s->states[s->n_states];
    *st = (state){.off = s->words_used, .used = x->used, .n = x->n, .key = key,
                  .complete = x->complete};
    memcpy(s->words + s->words_used, x->w, sizeof *x->w * x->used);
    s->words_used += x->used;
    memset(s->rows + (size_t)s->n_states * 256, ROW_UNKNOWN, sizeof *s->rows * 256);
    s->index[i] = ++s->n_states;
    return (int32_t)s->n_states - 1;
}

static void flush(scratch *s)
{
    s->n_states = s->words_used = 0;
    memset(s->index, 0, sizeof *s->index * CACHE_SLOTS);
}

/* Fills state k's row: the tops' distinct sets split the bytes into classes that every
 * top takes all or none of; one step per class. */
static void prepare(const grammar *g, scratch *s, uint32_t k)
{
    state *st = &s->states[k];
    uint16_t *row = s->rows + (size_t)k * 256;
    const uint32_t *w = s->words + st->off;
    uint32_t n_tops = 0, n_classes = 0;
    for (int b = 0; b < 256; b++)
        row[b] = ROW_REFUSED;
    memset(st->ok, 0, sizeof st->ok);
    st->bounded = false;
    for (uint32_t at = 0; at < st->used; at += w[at] + 1) {
        uint32_t set = ARG(g->elems[w[at + w[at]]]), i = 0;
        while (i < n_tops && s->tops[i] != set)
            i++;
        if (i == n_tops)
            s->tops[n_tops++] = set;
    }
    uint64_t all[4] = {0};
    for (uint32_t i = 0; i < n_tops; i++)
        for (int j = 0; j < 4; j++)
            all[j] |= g->sets[s->tops[i]][j];
    if (all[0] | all[1] | all[2] | all[3])
        memcpy(s->classes[n_classes++], all, sizeof all);
    for (uint32_t i = 0; i < n_tops; i++) {
        const uint64_t *t = g->sets[s->tops[i]];
        for (uint32_t c = 0, n = n_classes; c < n; c++) {
            uint64_t in[4], out[4], any_in = 0, any_out = 0;
            for (int j = 0; j < 4; j++) {
                in[j] = s->classes[c][j] & t[j];
                out[j] = s->classes[c][j] & ~t[j];
                any_in |= in[j], any_out |= out[j];
            }
            if (any_in && any_out) {
                memcpy(s->classes[c], in, sizeof in);
                memcpy(s->classes[n_classes++], out, sizeof out);
            }
        }
    }
    for (uint32_t c = 0; c < n_classes; c++) {
        const uint64_t *cl = s->classes[c];
        int j = 0;
        while (!cl[j])
            j++;
        uint8_t b = (uint8_t)(j * 64 + __builtin_ctzll(cl[j]));
        int rc = step(g, &s->wk, w, st->used, b, &s->sets[0]);
        if (rc != STEP_OK) {
            st->bounded |= rc != STEP_REFUSED;
            continue;
        }
        int32_t t = intern(s, &s->sets[0]);
        for (j = 0; j < 4; j++) {
            st->ok[j] |= cl[j];
            for (uint64_t m = cl[j]; m; m &= m - 1)
                row[j * 64 + __builtin_ctzll(m)] = (uint16_t)(t >= 0 ? t + 1 : ROW_UNKNOWN);
        }
    }
    st->ready = true;
}

/* Runs the bytes b[0..n) from state k. true when every byte is taken: the state after
 * them is state *end, or when the table ran out, the stackset *off (else NULL). */
static bool walk(const grammar *g, scratch *s, uint32_t k, const uint8_t *b, size_t n,
                 uint32_t *end, const stackset **off)
{
    size_t i = 0;
    for (; i < n; i++) {
        uint16_t t = s->rows[(size_t)k * 256 + b[i]];
        if (t == ROW_UNKNOWN && !s->states[k].ready) {
            prepare(g, s, k);
            t = s->rows[(size_t)k * 256 + b[i]];
        }
        if (t == ROW_REFUSED)
            return false;
        if (t == ROW_UNKNOWN)
            break; /* taken, to a state not in the table */
        k = t - 1u;
    }
    *end = k;
    *off = NULL;
    if (i == n)
        return true;
    /* past the table: steps from the stacks themselves, back and forth between sets */
    const uint32_t *w = s->words + s->states[k].off;
    uint32_t used = s->states[k].used;
    for (int j = 0; i < n; i++, j ^= 1) {
        if (step(g, &s->wk, w, used, b[i], &s->sets[j]) != STEP_OK)
            return false;
        *off = &s->sets[j];
        w = s->sets[j].w, used = s->sets[j].used;
    }
    return true;
}

/* Makes x (not in the table) the cursor's state: the table starts afresh with it. */
static void adopt(grammar_cursor *c, const stackset *x)
{
    flush(c->s);
    c->cur = (uint32_t)intern(c->s, x); /* an empty table holds any one set */
}

/* After a move: past three quarters of the table, it starts afresh with the state alone;
 * the state's row is filled. */
static void settle(grammar_cursor *c)
{
    scratch *s = c->s;
    if (s->n_states > CACHE_STATES * 3 / 4 || s->words_used > CACHE_WORDS * 3 / 4) {
        const state *st = &s->states[c->cur];
        stackset *x = &s->sets[0];
        memcpy(x->w, s->words + st->off, sizeof *x->w * st->used);
        x->used = st->used, x->n = st->n, x->complete = st->complete;
        x->hash = st->key / 2;
        adopt(c, x);
    }
    if (!s->states[c->cur].ready)
        prepare(c->g, s, c->cur);
}

static int advance(grammar_cursor *c, const uint8_t *b, size_t n)
{
    uint32_t end;
    const stackset *off;
    if (!walk(c->g, c->s, c->cur, b, n, &end, &off))
        return -1;
    if (off)
        adopt(c, off);
    else
        c->cur = end;
    settle(c);
    return 0;
}

static void scratch_free(scratch *s)
{
    if (!s)
        return;
    work_free(&s->wk);
    free(s->sets[0].w);
    free(s->sets[1].w);
    free(s->words);
    free(s->states);
    free(s->rows);
    free(s->index);
    free(s);
}

int grammar_cursor_new(const grammar *g, const grammar_vocab *v, grammar_cursor **out,
                       char err[ERR_MAX])
{
    grammar_cursor *c = calloc(1, sizeof *c);
    scratch *s = calloc(1, sizeof *s);
    *out = NULL;
    if (!c || !s || work_init(&s->wk)) {
        free(c);
        free(s);
        return err_set(err, "grammar: out of memory for a cursor");
    }
    s->sets[0].w = malloc(sizeof *s->sets[0].w * SET_WORDS);
    s->sets[1].w = malloc(sizeof *s->sets[1].w * SET_WORDS);
    s->words = malloc(sizeof *s->words * CACHE_WORDS);
    s->states = malloc(sizeof *s->states * CACHE_STATES);
    s->rows = malloc(sizeof *s->rows * CACHE_STATES * 256);
    s->index = calloc(CACHE_SLOTS, sizeof *s->index);
    if (!s->sets[0].w || !s->sets[1].w || !s->words || !s->states || !s->rows || !s->index) {
        scratch_free(s);
        free(c);
        return err_set(err, "grammar: out of memory for a cursor");
    }
    c->g = g, c->v = v, c->s = s;
    grammar_cursor_reset(c);
    *out = c;
    return 0;
}

void grammar_cursor_free(grammar_cursor *c)
{
    if (!c)
        return;
    scratch_free(c->s);
    free(c);
}

void grammar_cursor_reset(grammar_cursor *c)
{
    /* within the bounds: grammar_compile checked the start */
    start_set(c->g, &c->s->wk, &c->s->sets[0]);
    int32_t k = intern(c->s, &c->s->sets[0]);
    if (k < 0)
        adopt(c, &c->s->sets[0]);
    else
        c->cur = (uint32_t)k;
    settle(c);
}

int grammar_cursor_copy(grammar_cursor *dst, const grammar_cursor *src)
{
    if (dst->g != src->g || dst->v != src->v)
        return -1;
    if (dst == src)
        return 0;
    const state *st = &src->s->states[src->cur];
    stackset *x = &dst->s->sets[0];
    memcpy(x->w, src->s->words + st->off, sizeof *x->w * st->used);
    x->used = st->used, x->n = st->n, x->complete = st->complete;
    x->hash = st->key / 2;
    int32_t k = intern(dst->s, x);
    if (k < 0)
        adopt(dst, x);
    else
        dst->cur = (uint32_t)k;
    settle(dst);
    return 0;
}

bool grammar_allows(const grammar_cursor *c, int32_t token)
{
    const grammar_vocab *v = c->v;
    if (!v || token < 0 || token >= v->pieces.n_vocab)
        return false;
    uint32_t from = v->pieces.start[token], n = v->pieces.start[token + 1] - from;
    if (n == 0)
        return v->eog[token] && grammar_complete(c);
    uint32_t end;
    const stackset *off;
    return walk(c->g, c->s, c->cur, v->pieces.bytes + from, n, &end, &off);
}

int grammar_take(grammar_cursor *c, int32_t token)
{
    const grammar_vocab *v = c->v;
    if (!v || token < 0 || token >= v->pieces.n_vocab)
        return -1;
    uint32_t from = v->pieces.start[token], n = v->pieces.start[token + 1] - from;
    if (n == 0)
        return v->eog[token] && grammar_complete(c) ? 0 : -1;
    return advance(c, v->pieces.bytes + from, n);
}

int grammar_feed(grammar_cursor *c, const void *bytes, size_t n)
{
    return n ? advance(c, bytes, n) : 0;
}

bool grammar_complete(const grammar_cursor *c)
{
    return c->s->states[c->cur].complete;
}

bool grammar_finished(const grammar_cursor *c)
{
    const state *st = &c->s->states[c->cur];
    return st->complete && !(st->ok[0] | st->ok[1] | st->ok[2] | st->ok[3]);
}

bool grammar_bounded(const grammar_cursor *c)
{
    return c->s->states[c->cur].bounded;
}
