/*
 * regex: a JSON Schema pattern compiled into a byte automaton. What is refused and how it
 * is named; whole strings matched or not (multi-byte characters, classes, anchors, lengths
 * in characters); an oracle test against PCRE2 (told ECMA's meaning of '.', \s and \u) on
 * random strings and on the automaton's own strings, mutated; and the automaton's promise:
 * every state it can reach reaches acceptance, so that a writer never runs out of bytes.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/model/regex.h"
#include "tests/support/test.h"

#define NO_MAX UINT32_MAX

static regex_dfa *compile_or_fail(const char *pattern, uint32_t min, uint32_t max)
{
    char err[ERR_MAX];
    regex_dfa *d = NULL;
    if (regex_compile(pattern, strlen(pattern), min, max, &d, err))
        test_fail(__FILE__, __LINE__, "'%s' [%u, %u]: %s", pattern, min, max, err);
    return d;
}

/* Walks s from the start: whether the automaton accepts it whole. */
static bool dfa_matches(const regex_dfa *d, const char *s, size_t len)
{
    uint16_t st = regex_start(d);
    for (size_t i = 0; i < len && st != REGEX_DEAD; i++)
        st = regex_step(d, st, (uint8_t)s[i]);
    return regex_accepts(d, st);
}

/* ---- compiling ---- */

static void refusals_name_the_construct(void)
{
    static const struct {
        const char *pattern;
        uint32_t min, max;
        const char *says;
    } cases[] = {
        {"a(?=b)", 0, NO_MAX, "lookahead '(?=' at byte 1"},
        {"a(?!b)", 0, NO_MAX, "negative lookahead '(?!' at byte 1"},
        {"(?<=a)b", 0, NO_MAX, "lookbehind '(?<=' at byte 0"},
        {"(?<!a)b", 0, NO_MAX, "negative lookbehind '(?<!' at byte 0"},
        {"(a)\\1", 0, NO_MAX, "backreference '\\1' at byte 3"},
        {"(?<n>a)\\k<n>", 0, NO_MAX, "backreference '\\k' at byte 7"},
        {"\\bword", 0, NO_MAX, "word boundary '\\b' at byte 0"},
        {"a\\Bb", 0, NO_MAX, "'\\B' at byte 1"},
        {"a^b", 0, NO_MAX, "anchor '^' at byte 1"},
        {"a$b", 0, NO_MAX, "anchor '$' at byte 1"},
        {"(^a)", 0, NO_MAX, "anchor '^' at byte 1"},
        {"(a$)", 0, NO_MAX, "anchor '$' at byte 2"},
        {"^^a", 0, NO_MAX, "anchor '^' at byte 1"},
        {"\xff", 0, NO_MAX, "invalid UTF-8 at byte 0"},
        {"ab\xc3", 0, NO_MAX, "invalid UTF-8 at byte 2"},
        {"a\xed\xa0\x80", 0, NO_MAX, "invalid UTF-8 at byte 1"}, /* a surrogate */
        {"\xc0\x80", 0, NO_MAX, "invalid UTF-8 at byte 0"},       /* overlong */
        {"(ab", 0, NO_MAX, "'(' at byte 0 is not closed"},
        {"a(b(c)", 0, NO_MAX, "'(' at byte 1 is not closed"},
        {"ab)", 0, NO_MAX, "')' at byte 2 closes no group"},
        {"[ab", 0, NO_MAX, "'[' at byte 0 is not closed"},
        {"a{3,2}", 0, NO_MAX, "repeat {3,2} at byte 1"},
        {"a{1001}", 0, NO_MAX, "count above 1000 at byte 1"},
        {"a{2,99999999999}", 0, NO_MAX, "count above 1000 at byte 1"},
        {"*a", 0, NO_MAX, "'*' at byte 0 repeats nothing"},
        {"a|+", 0, NO_MAX, "'+' at byte 2 repeats nothing"},
        {"a**", 0, NO_MAX, "'*' at byte 2 repeats nothing"},
        {"a{2}{3}", 0, NO_MAX, "'{' at byte 4 repeats nothing"},
        {"^*", 0, NO_MAX, "'*' at byte 1 repeats nothing"},
        {"a{", 0, NO_MAX, "'{' at byte 1 starts no repeat"},
        {"a{x}", 0, NO_MAX, "'{' at byte 1 starts no repeat"},
        {"a}", 0, NO_MAX, "lone '}' at byte 1"},
        {"[]a]", 0, NO_MAX, "lone ']' at byte 3"},
        {"\\p{L}", 0, NO_MAX, "Unicode property '\\p' at byte 0"},
        {"\\u{1F600}", 0, NO_MAX, "'\\u{' at byte 0"},
        {"(?i)a", 0, NO_MAX, "group '(?i' at byte 0"},
        {"(?>a)", 0, NO_MAX, "group '(?>' at byte 0"},
        {"(?<>a)", 0, NO_MAX, "group name at byte 3"},
        {"[z-a]", 0, NO_MAX, "range out of order at byte 1"},
        {"[\\d-z]", 0, NO_MAX, "range with a class escape at byte 1"},
        {"[a-\\w]", 0, NO_MAX, "range with a class escape at byte 1"},
        {"\\uD83D", 0, NO_MAX, "lone surrogate '\\uD83D' at byte 0"},
        {"[\\uDE00]", 0, NO_MAX, "lone surrogate '\\uDE00' at byte 1"},
        {"\\x4", 0, NO_MAX, "'\\x' at byte 0 needs two hex digits"},
        {"\\u12", 0, NO_MAX, "'\\u' at byte 0 needs four hex digits"},
        {"\\c1", 0, NO_MAX, "'\\c' at byte 0 needs a letter"},
        {"\\q", 0, NO_MAX, "escape '\\q' at byte 0"},
        {"\\01", 0, NO_MAX, "escape '\\0' followed by a digit at byte 0"},
        {"\\\xc3\xa9", 0, NO_MAX, "escape of a non-ASCII character at byte 0"},
        {"ab\\", 0, NO_MAX, "'\\' at byte 2 ends the pattern"},
        {"^a{5}$", 0, 3, "no string matches '^a{5}$' within its lengths (0 to 3 characters)"},
        {"^a{5}$", 6, NO_MAX, "no string matches '^a{5}$' within its lengths (at least 6"},
        {"a", 3, 2, "no string matches 'a' within its lengths"},
        {"^\\x00$", 0, NO_MAX, "no string matches"}, /* a control JSON cannot write */
        {"x[]", 0, NO_MAX, "no string matches"},
        {"((a{1000}){1000})", 0, NO_MAX, "more than"},
        {"^(a|b)*a(a|b){15}$", 0, NO_MAX, "more than 16384 states"},
        {"^[^<>]*$", 0, 5000, "more than 16384 states"},
        {"^[a-z]+$", 100000, NO_MAX, "more than 16384 states"},
        {"((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((("
         "((((((((((((((((((((((((((((((((((((((((((((((((((((((a", 0, NO_MAX,
         "groups nested deeper than"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char err[ERR_MAX] = "";
        regex_dfa *d = NULL;
        int rc = regex_compile(cases[i].pattern, strlen(cases[i].pattern), cases[i].min,
                               cases[i].max, &d, err);
        CHECK_MSG(rc == -1 && !d, "'%s' was compiled", cases[i].pattern);
        CHECK_MSG(strstr(err, cases[i].says), "'%s': '%s' does not say '%s'", cases[i].pattern,
                  err, cases[i].says);
    }
}

/* The length is the caller's: a NUL byte is a character (one JSON cannot write raw). */
static void patterns_are_counted_bytes(void)
{
    char err[ERR_MAX];
    regex_dfa *d = NULL;
    CHECK(regex_compile("^ab$\0junk", 4, 0, NO_MAX, &d, err) == 0);
    CHECK(dfa_matches(d, "ab", 2));
    CHECK(!dfa_matches(d, "abc", 3));
    regex_free(d);
    CHECK(regex_compile("a\0b", 3, 0, NO_MAX, &d, err) == -1);
    CHECK_MSG(strstr(err, "no string matches"), "%s", err);
    regex_free(NULL);
    enum { LONG = 300000 };
    char *p = malloc(LONG);
    memset(p, 'a', LONG);
    CHECK(regex_compile(p, LONG, 0, NO_MAX, &d, err) == -1);
    free(p);
    CHECK_MSG(strstr(err, "300000 bytes long, more than 262144"), "%s", err);
}

/* REGEX_DEAD refuses every byte and accepts nothing; the start is never dead. */
static void dead_stays_dead(void)
{
    regex_dfa *d = compile_or_fail("", 0, NO_MAX);
    if (!d)
        return;
    CHECK(regex_start(d) != REGEX_DEAD);
    CHECK(regex_accepts(d, regex_start(d)));
    CHECK(!regex_accepts(d, REGEX_DEAD));
    for (int b = 0; b < 256; b++)
        CHECK(regex_step(d, REGEX_DEAD, (uint8_t)b) == REGEX_DEAD);
    regex_free(d);
}

/* ---- whole strings ---- */

typedef struct match_case {
    const char *pattern, *subject;
    bool want;
} match_case;

static void strings_match_or_not(void)
{
    static const match_case cases[] = {
        /* multi-byte literals */
        {"^héllo$", "héllo", true},
        {"^héllo$", "hello", false},
        {"^€$", "€", true},
        {"^😀+$", "😀😀", true},
        {"^😀+$", "😀x", false},
        {"^\\x41\\u00e9$", "Aé", true},
        {"^\\uD83D\\uDE00$", "😀", true},
        /* classes over other scripts */
        {"^[а-я]+$", "привет", true},
        {"^[а-я]+$", "Привет", false},
        {"^[α-ω]{2}$", "αβ", true},
        {"^[\\u4e00-\\u9fff]+$", "中文", true},
        {"^[\\u4e00-\\u9fff]+$", "中a", false},
        {"^[😀-😎]$", "😎", true},
        {"^[😀-😎]$", "😏", false},
        /* negated classes against 1-, 2-, 3- and 4-byte characters */
        {"^[^a]$", "é", true},
        {"^[^a]$", "€", true},
        {"^[^a]$", "😀", true},
        {"^[^a]$", "a", false},
        {"^[^a]$", "", false},
        {"^[^a]$", "bc", false},
        {"^[^é]$", "é", false},
        {"^[^é]$", "ê", true}, /* the same lead byte */
        {"^[^€]$", "€", false},
        {"^[^€]$", "₭", true},
        {"^[^€]$", "ₐ", true},
        {"^[^😀]$", "😀", false},
        {"^[^😀]$", "😁", true},
        {"^[^😀]$", "\xf4\x8f\xbf\xbf", true}, /* U+10FFFF */
        {"^[^]$", "\n", true},
        /* '.' is any character but line terminators */
        {"^.$", "a", true},
        {"^.$", "😀", true},
        {"^.$", "\t", true},
        {"^.$", "\n", false},
        {"^.$", "\r", false},
        {"^.$", "\u2028", false},
        {"^.$", "\u2029", false},
        /* ECMA's \s, \d, \w */
        {"^\\s$", "\u3000", true},
        {"^\\s$", " ", true},
        {"^\\s$", "\u00a0", true},
        {"^\\s$", "\ufeff", true},
        {"^\\s$", "\u2009", true},
        {"^\\s$", "\u200b", false}, /* a zero-width space is not one */
        {"^\\s$", "a", false},
        {"^\\S$", "\u3000", false},
        {"^\\S$", "a", true},
        {"^\\d$", "\u0663", false}, /* an Arabic-Indic digit */
        {"^\\w$", "é", false},
        {"^\\W$", "é", true},
        {"^\\d\\w\\D\\W$", "7_x!", true},
        {"^[\\d\\s]+$", "1 2\u30003", true},
        {"^[^\\d\\s]+$", "a b", false},
        {"^[^\\d\\s]+$", "ab", true},
        {"^[\\w-]+$", "a-b_c", true},
        {"^[a-]$", "-", true},
        {"^[-a]$", "-", true},
        {"^[a-c-e]$", "-", true},
        {"^[a-c-e]$", "d", false},
        {"^[a-c-e]$", "e", true},
        {"^[.*+?()|{}$^]+$", ".*+?()|{}$^", true},
        /* escapes */
        {"^\\cJ$", "\n", true},
        {"^[\\b]$", "\b", true},
        {"^\\/\\.\\-\\ $", "/.- ", true},
        {"^\\t\\n\\f\\r$", "\t\n\f\r", true},
        {"^a\\.b$", "axb", false},
        /* search: not anchored unless ^ or $ says so */
        {"abc", "xxabcxx", true},
        {"abc", "abxc", false},
        {"^abc", "abcx", true},
        {"^abc", "xabc", false},
        {"abc$", "xabc", true},
        {"abc$", "abcx", false},
        {"^a|b$", "ax", true},
        {"^a|b$", "xb", true},
        {"^a|b$", "xa", false},
        {"^a|b$", "bx", false},
        {"x", "a\nx\n", true},
        {"", "anything at all", true},
        {"", "", true},
        {"^$", "", true},
        {"^$", "a", false},
        /* groups and repeats */
        {"^(?:ab)+$", "abab", true},
        {"^(?:ab)+$", "aba", false},
        {"^(?<x>a|b)c$", "bc", true},
        {"^a{2,3}$", "a", false},
        {"^a{2,3}$", "aa", true},
        {"^a{2,3}$", "aaa", true},
        {"^a{2,3}$", "aaaa", false},
        {"^a{2,}$", "aaaaa", true},
        {"^a{0}b$", "b", true},
        {"^a+?$", "aaa", true},
        {"^a??b$", "b", true},
        {"^a{1,2}?$", "aa", true},
        {"^(a|)+$", "", true},
        {"^(a*)*b$", "aab", true},
        {"^(|a|ab)(c|bcd)$", "abcd", true},
        {"^()$", "", true},
        /* bytes apart in one state only (a and b after y): their classes stay apart */
        {"^x[ab]*ya*$", "xabyaa", true},
        {"^x[ab]*ya*$", "xabyab", false},
        /* controls: JSON writes \b \t \n \f \r, not the others */
        {"^[\\s\\S]*$", "\t\b\f", true},
        {"^[\\s\\S]*$", "a\x01", false},
        {"^[\\s\\S]*$", "\x7f", true},
        {"[^a]", "\x1f", false},
        {"^\\v?$", "\v", false},
        /* invalid UTF-8 never matches */
        {"^[^a]+$", "\xc0\x80", false},
        {"^[^a]+$", "\xed\xa0\x80", false},
        {"^[^a]+$", "\xf4\x90\x80\x80", false},
        {"^[^a]+$", "\x80", false},
        {"", "\xff", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        regex_dfa *d = compile_or_fail(cases[i].pattern, 0, NO_MAX);
        if (!d)
            return;
        bool got = dfa_matches(d, cases[i].subject, strlen(cases[i].subject));
        regex_free(d);
        CHECK_MSG(got == cases[i].want, "'%s' on '%s': %d, expected %d", cases[i].pattern,
                  cases[i].subject, got, cases[i].want);
    }
}

/* Lengths are in characters, whatever their bytes. */
static void lengths_count_characters(void)
{
    static const struct {
        const char *pattern;
        uint32_t min, max;
        const char *subject;
        bool want;
    } cases[] = {
        {"^.+$", 2, 3, "éé", true},
        {"^.+$", 2, 3, "é", false},
        {"^.+$", 2, 3, "éééé", false},
        {"^.+$", 2, 3, "😀😀😀", true},
        {"^.+$", 2, 3, "a€😀", true},
        {"abc", 0, 5, "xxabc", true},
        {"abc", 0, 5, "xxxabc", false},
        {"", 3, NO_MAX, "ab", false},
        {"", 3, NO_MAX, "abc", true},
        {"", 3, NO_MAX, "abcdefgh", true},
        {"", 0, 0, "", true},
        {"", 0, 0, "a", false},
        {"^a*$", 4, 4, "aaaa", true},
        {"^a*$", 4, 4, "aaa", false},
        {"^(aa)*$", 0, 5, "aaaa", true},
        {"^(aa)*$", 0, 5, "aaaaaa", false},
        {"[€]", 2, 2, "€€", true},
        {"[€]", 2, 2, "x€", true},
        {"[€]", 2, 2, "€", false},
        {"^[^<>]*$", 0, 1500, "<", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        regex_dfa *d = compile_or_fail(cases[i].pattern, cases[i].min, cases[i].max);
        if (!d)
            return;
        bool got = dfa_matches(d, cases[i].subject, strlen(cases[i].subject));
        regex_free(d);
        CHECK_MSG(got == cases[i].want, "'%s' [%u, %u] on '%s': %d, expected %d",
                  cases[i].pattern, cases[i].min, cases[i].max, cases[i].subject, got,
                  cases[i].want);
    }
}

/* ---- the oracle ---- */

/* ECMA's \s, for PCRE2 (whose \s is ASCII's). */
#define ECMA_SPACES "\\t\\n\\x0b\\f\\r \\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}" \
                    "\\x{202f}\\x{205f}\\x{3000}\\x{feff}"

/* The pattern as PCRE2 reads ECMA's: '.', \s, \S, \v and \uHHHH spelled out. The oracle's
 * patterns have no \S inside a class. */
static bool to_pcre(const char *p, char *out, size_t cap)
{
    size_t n = 0;
    bool in_class = false;
#define PUT(s)                                                                             \
    do {                                                                                   \
        size_t l_ = strlen(s);                                                             \
        if (n + l_ >= cap)                                                                 \
            return false;                                                                  \
        memcpy(out + n, s, l_);                                                            \
        n += l_;                                                                           \
    } while (0)
    for (; *p; p++) {
        char one[2] = {*p, 0};
        if (*p == '\\') {
            char e = p[1];
            if (e == 's')
                PUT(in_class ? ECMA_SPACES : "[" ECMA_SPACES "]");
            else if (e == 'S' && !in_class)
                PUT("[^" ECMA_SPACES "]");
            else if (e == 'S')
                return false;
            else if (e == 'v')
                PUT("\\x0b");
            else if (e == 'u') {
                char hex[16];
                snprintf(hex, sizeof hex, "\\x{%.4s}", p + 2);
                PUT(hex);
                p += 4;
            } else {
                char two[3] = {'\\', e, 0};
                PUT(two);
            }
            p++;
        } else if (*p == '[' && !in_class) {
            in_class = true;
            PUT(one);
        } else if (*p == ']' && in_class) {
            in_class = false;
            PUT(one);
        } else if (*p == '.' && !in_class) {
            PUT("[^\\n\\r\\x{2028}\\x{2029}]");
        } else {
            PUT(one);
        }
    }
#undef PUT
    out[n] = 0;
    return true;
}

typedef struct oracle {
    pcre2_code *re;
    pcre2_match_data *md;
    uint32_t min, max;
} oracle;

static bool oracle_open(oracle *o, const char *pattern, uint32_t min, uint32_t max)
{
    char p[1024];
    if (!to_pcre(pattern, p, sizeof p))
        return false;
    int code;
    PCRE2_SIZE at;
    o->re = pcre2_compile((PCRE2_SPTR)p, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_DOLLAR_ENDONLY,
                          &code, &at, NULL);
    if (!o->re)
        return false;
    o->md = pcre2_match_data_create_from_pattern(o->re, NULL);
    o->min = min;
    o->max = max;
    return true;
}

static void oracle_close(oracle *o)
{
    pcre2_match_data_free(o->md);
    pcre2_code_free(o->re);
}

/* Characters of valid UTF-8 s, or -1 when it is not valid (as the automaton reads it). */
static long utf8_chars(const uint8_t *s, size_t len)
{
    long n = 0;
    for (size_t i = 0; i < len; n++) {
        uint8_t c = s[i];
        size_t k = c < 0x80 ? 1 : c >= 0xc2 && c < 0xe0 ? 2 : c >= 0xe0 && c < 0xf0 ? 3
                              : c >= 0xf0 && c < 0xf5 ? 4 : 0;
        if (!k || i + k > len)
            return -1;
        uint32_t cp = k == 1 ? c : c & (0x7f >> k);
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return -1;
            cp = cp << 6 | (s[i + j] & 0x3f);
        }
        if ((k == 3 && cp < 0x800) || (k == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return -1;
        i += k;
    }
    return n;
}

/* What the automaton should answer: PCRE2 finds the pattern in s, s is within the lengths
 * and has no control that JSON cannot write raw. -1 when s is not valid UTF-8. */
static int oracle_says(const oracle *o, const char *s, size_t len)
{
    long chars = utf8_chars((const uint8_t *)s, len);
    if (chars < 0)
        return -1;
    for (size_t i = 0; i < len; i++) {
        uint8_t c = (uint8_t)s[i];
        if (c < 0x20 && c != '\b' && c != '\t' && c != '\n' && c != '\f' && c != '\r')
            return 0;
    }
    if ((uint64_t)chars < o->min || (uint64_t)chars > o->max)
        return 0;
    return pcre2_match(o->re, (PCRE2_SPTR)s, len, 0, 0, o->md, NULL) >= 0;
}

typedef struct oracle_case {
    const char *pattern;
    const char *alphabet; /* characters that make its strings, besides the noise */
    uint32_t min, max;
} oracle_case;

static const oracle_case oracle_cases[] = {
    {"^\\d{4}-\\d{2}-\\d{2}$", "0123456789-", 0, NO_MAX},
    {"^([01]\\d|2[0-3]):[0-5]\\d(:[0-5]\\d)?$", "0123456789:", 0, NO_MAX},
    {"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
     "0123456789abcdefABCDEF-g", 0, NO_MAX},
    {"^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\\.[A-Za-z]{2,}$", "ab.@-_%+1Z", 0, 20},
    {"^\\+?[1-9]\\d{1,14}$", "+0123456789", 0, NO_MAX},
    {"^\\(\\d{3}\\) \\d{3}-\\d{4}$", "() -0123456789", 0, NO_MAX},
    {"^[A-Z]{3}-\\d{2,4}$", "ABCZ-0129a", 0, NO_MAX},
    {"^(red|green|blue)$", "redgnblu", 0, NO_MAX},
    {"cat|dog", "catdog", 0, 8},
    {"^(?:(?:a|b)c)+d?$", "abcd", 0, NO_MAX},
    {"^a.*?b$", "ab\n", 0, NO_MAX},
    {"^(?<year>\\d{4})/(?<month>0[1-9]|1[0-2])$", "0123456789/", 0, NO_MAX},
    {"^[а-яА-ЯёЁ]+$", "абяАЯёЁжz", 1, 6},
    {"^[\\u4e00-\\u9fff]{1,4}$", "中文字一龥a", 0, NO_MAX},
    {"^[^@\\s]+@[^@\\s]+$", "a@é \u3000\u00a0", 0, NO_MAX},
    {"^\\w+(\\s\\w+)*$", "ab_1 \u3000\u2028é", 3, 10},
    {"€\\d+", "€12", 0, NO_MAX},
    {"^.{2,5}$", "aé€😀\n\r\u2028", 0, NO_MAX},
    {"^[^a-z]*$", "aZé😀-", 0, NO_MAX},
    {"x{2,}y?", "xy", 0, 6},
    {"^https?://[a-z0-9.-]+(/[^\\s]*)?$", "htps:/a.z0-\u3000", 0, NO_MAX},
    {"^#[0-9A-Fa-f]{6}$|^#[0-9A-Fa-f]{3}$", "#0fAg", 0, NO_MAX},
    {"^$", "a", 0, NO_MAX},
    {"", "a", 2, 4},
    {"^(a|ab)(c|bcd)(d*)$", "abcd", 0, NO_MAX},
    {"^[😀-😎]+x?$", "😀😎😏x", 0, NO_MAX},
    {"\\s{2}", " \u3000\ufeff\u200bx", 0, NO_MAX},
    {"^[\\x41-\\x5a\\u00e9]+$", "AZéèa", 0, NO_MAX},
    {"^(?:\\d{3}-){2}\\d{4}$", "0123456789-", 0, NO_MAX},
    {"^a|b$", "abx", 0, NO_MAX},
    {"^\\S+$", "a\u3000\u00a0é", 0, 4},
    {"^[\\d\\-+() ]{7,15}$", "0123456789-+() ", 0, NO_MAX},
    {"^\\D\\W$", "a1!é", 0, NO_MAX},
    {"^(?:[a-z]+|\\d+)(?:,(?:[a-z]+|\\d+)){0,3}$", "ab1,", 0, NO_MAX},
    {"(ab|a)(bc|c)*?$", "abc", 0, NO_MAX},
};

/* Characters that no pattern is written for: controls, line terminators, spaces and
 * characters of 1 to 4 bytes. */
static const char *const noise[] = {
    "a", "Z", "0", "9", "-", " ", "\n", "\r", "\t", "\x01", "\x7f", "é", "ё", "€",
    "\u3000", "\u2028", "\u00a0", "😀", "中", "\ufeff", "_", ".", "@", ":", "/",
};

/* The i-th character (a UTF-8 sequence) of alphabet into out; its length. */
static size_t alphabet_char(const char *alphabet, size_t i, char out[5])
{
    const uint8_t *p = (const uint8_t *)alphabet;
    for (;;) {
        size_t k = *p < 0x80 ? 1 : *p < 0xe0 ? 2 : *p < 0xf0 ? 3 : 4;
        if (i-- == 0) {
            memcpy(out, p, k);
            return k;
        }
        p += k;
    }
}

static size_t alphabet_len(const char *alphabet)
{
    size_t n = 0;
    for (const uint8_t *p = (const uint8_t *)alphabet; *p; p++)
        n += (*p & 0xc0) != 0x80;
    return n;
}

/* A random character: mostly of the pattern's alphabet, else noise. */
static size_t random_char(const char *alphabet, uint64_t *rng, char out[5])
{
    if (test_random(rng) % 4) {
        size_t n = alphabet_len(alphabet);
        return alphabet_char(alphabet, test_random(rng) % n, out);
    }
    const char *c = noise[test_random(rng) % (sizeof noise / sizeof *noise)];
    memcpy(out, c, strlen(c));
    return strlen(c);
}

enum { WALK_CAP = 256 };

/* A random walk over the bytes the automaton allows, stopped at an accepting state with
 * chance 1 in stop_one_in, or where nothing more is allowed (which must be accepting).
 * Its length in bytes; -1 when it ran past WALK_CAP bytes, -2 on a dead end. */
static int walk(const regex_dfa *d, uint64_t *rng, int stop_one_in, char out[WALK_CAP])
{
    uint16_t st = regex_start(d);
    for (int len = 0; len < WALK_CAP; len++) {
        uint8_t ok[256];
        int n = 0;
        for (int b = 0; b < 256; b++)
            if (regex_step(d, st, (uint8_t)b) != REGEX_DEAD)
                ok[n++] = (uint8_t)b;
        if (n == 0)
            return regex_accepts(d, st) ? len : -2;
        if (regex_accepts(d, st) && test_random(rng) % (uint64_t)stop_one_in == 0)
            return len;
        out[len] = (char)ok[test_random(rng) % (uint64_t)n];
        st = regex_step(d, st, (uint8_t)out[len]);
    }
    return -1;
}

/* A string the automaton accepts: a random walk of up to 32 bytes, then the shortest way
 * from there to acceptance (breadth first, bytes tried from a random one on, so that
 * completions vary). Its length in bytes; -1 when that is past WALK_CAP. */
static int sample(const regex_dfa *d, uint64_t *rng, char out[WALK_CAP])
{
    static uint32_t seen[65536], gen;
    static uint16_t queue[65536], prev[65536];
    static uint8_t via[65536];
    uint16_t st = regex_start(d);
    int len = 0, steps = (int)(test_random(rng) % 33);
    for (; len < steps; len++) {
        uint8_t ok[256];
        int n = 0;
        for (int b = 0; b < 256; b++)
            if (regex_step(d, st, (uint8_t)b) != REGEX_DEAD)
                ok[n++] = (uint8_t)b;
        if (n == 0)
            break;
        out[len] = (char)ok[test_random(rng) % (uint64_t)n];
        st = regex_step(d, st, (uint8_t)out[len]);
    }
    gen++;
    size_t head = 0, tail = 0;
    queue[tail++] = st;
    seen[st] = gen;
    int from = (int)(test_random(rng) % 256);
    while (!regex_accepts(d, queue[head])) {
        uint16_t q = queue[head++];
        for (int i = 0; i < 256; i++) {
            uint8_t b = (uint8_t)(from + i);
            uint16_t t = regex_step(d, q, b);
            if (t != REGEX_DEAD && seen[t] != gen) {
                seen[t] = gen;
                prev[t] = q;
                via[t] = b;
                queue[tail++] = t;
            }
        }
    }
    uint8_t path[WALK_CAP];
    int n = 0;
    for (uint16_t t = queue[head]; t != st && n < WALK_CAP; t = prev[t])
        path[n++] = via[t];
    if (len + n > WALK_CAP)
        return -1;
    while (n)
        out[len++] = (char)path[--n];
    return len;
}

/* Byte offsets of s's characters, with len last; how many characters. */
static size_t char_starts(const char *s, size_t len, size_t *starts)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        if (((uint8_t)s[i] & 0xc0) != 0x80)
            starts[n++] = i;
    starts[n] = len;
    return n;
}

/* s with one character replaced, inserted or deleted, into out; its length. */
static size_t mutate(const char *s, size_t len, const char *alphabet, uint64_t *rng,
                     char *out)
{
    size_t starts[WALK_CAP + 1];
    size_t n = char_starts(s, len, starts);
    size_t at = test_random(rng) % (n + 1);
    int op = n == 0 ? 1 : (int)(test_random(rng) % 3);
    char c[5];
    size_t k = op == 2 ? 0 : random_char(alphabet, rng, c);
    size_t from = starts[at], to = op == 1 || at == n ? from : starts[at + 1];
    memcpy(out, s, from);
    memcpy(out + from, c, k);
    memcpy(out + from + k, s + to, len - to);
    return from + k + len - to;
}

/* Random strings, and the automaton's own strings as they are and mutated: the automaton
 * answers as PCRE2 (within the lengths, without unwritable controls) does. */
static void agrees_with_pcre2(void)
{
#ifdef TEST_SANITIZED
    const int strings = 1000, samples = 150;
#else
    const int strings = 2000, samples = 300;
#endif
    uint64_t rng = 0x2545f4914f6cdd1dull;
    test_random_seed(&rng);
    int all_yes = 0, all_no = 0;
    for (size_t i = 0; i < sizeof oracle_cases / sizeof *oracle_cases; i++) {
        const oracle_case *c = &oracle_cases[i];
        regex_dfa *d = compile_or_fail(c->pattern, c->min, c->max);
        if (!d)
            return;
        oracle o;
        CHECK_MSG(oracle_open(&o, c->pattern, c->min, c->max), "PCRE2 refuses '%s'",
                  c->pattern);
        int yes = 0, no = 0;
        char s[WALK_CAP * 2];
        for (int k = 0; k < strings + 2 * samples; k++) {
            size_t len = 0;
            if (k < strings) {
                size_t chars = test_random(&rng) % 24;
                for (size_t j = 0; j < chars; j++)
                    len += random_char(c->alphabet, &rng, s + len);
            } else {
                char w[WALK_CAP];
                int n = sample(d, &rng, w);
                if (n < 0)
                    continue;
                if (k % 2) {
                    len = mutate(w, (size_t)n, c->alphabet, &rng, s);
                } else {
                    memcpy(s, w, (size_t)n);
                    len = (size_t)n;
                }
            }
            int want = oracle_says(&o, s, len);
            bool got = dfa_matches(d, s, len);
            CHECK_MSG(want >= 0, "'%s' accepts invalid UTF-8 '%.*s'", c->pattern, (int)len, s);
            want ? yes++ : no++;
            CHECK_MSG(got == (want == 1), "'%s' [%u, %u] on '%.*s': %d, PCRE2 says %d",
                      c->pattern, c->min, c->max, (int)len, s, got, want);
        }
        oracle_close(&o);
        regex_free(d);
        CHECK_MSG(yes >= samples / 2 && no >= samples / 4, "'%s': %d matches, %d not",
                  c->pattern, yes, no);
        all_yes += yes;
        all_no += no;
    }
    printf("       %d strings matched, %d did not\n", all_yes, all_no);
}

/* ---- no dead ends ---- */

/* Every state reachable from the start reaches an accepting one (found backwards from the
 * accepting states over all 256 bytes). */
static void every_state_reaches_acceptance(void)
{
    static uint16_t order[65536];
    static bool seen[65536], live[65536];
    for (size_t i = 0; i < sizeof oracle_cases / sizeof *oracle_cases; i++) {
        const oracle_case *c = &oracle_cases[i];
        regex_dfa *d = compile_or_fail(c->pattern, c->min, c->max);
        if (!d)
            return;
        memset(seen, 0, sizeof seen);
        size_t n = 0;
        order[n++] = regex_start(d);
        seen[regex_start(d)] = true;
        for (size_t k = 0; k < n; k++)
            for (int b = 0; b < 256; b++) {
                uint16_t t = regex_step(d, order[k], (uint8_t)b);
                if (t != REGEX_DEAD && !seen[t]) {
                    seen[t] = true;
                    order[n++] = t;
                }
            }
        CHECK(n < REGEX_STATES_MAX);
        memset(live, 0, sizeof live);
        bool more = true;
        while (more) {
            more = false;
            for (size_t k = n; k-- > 0;) {
                uint16_t s = order[k];
                if (live[s])
                    continue;
                bool l = regex_accepts(d, s);
                for (int b = 0; b < 256 && !l; b++)
                    l = live[regex_step(d, s, (uint8_t)b)];
                if (l)
                    live[s] = more = true;
            }
        }
        for (size_t k = 0; k < n; k++)
            CHECK_MSG(live[order[k]], "'%s': state %u reaches no accepting state", c->pattern,
                      order[k]);
        regex_free(d);
    }
}

/* Random walks over the allowed bytes never stall before acceptance; what they end on is
 * matched by PCRE2 and within the lengths, even when the lengths are what stops them. */
static void random_walks_end_accepted(void)
{
    static const oracle_case cases[] = {
        {"^[^<>]*$", "", 5, 40},
        {"abc", "", 3, 9},
        {"^.+$", "", 2, 3},
        {"^(aa)*$", "", 0, 7},
        {"^\\w+(\\s\\w+)*$", "", 2, 12},
        {"", "", 0, NO_MAX},
        {"^[а-яё]{2,}|\\d$", "", 0, 30},
        {"\\s", "", 1, 4},
        {"^(?:[😀-😎]|x){3,}$", "", 0, 5},
    };
#ifdef TEST_SANITIZED
    const int walks = 600;
#else
    const int walks = 2000;
#endif
    uint64_t rng = 0x853c49e6748fea9bull;
    test_random_seed(&rng);
    int ended = 0, total = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const oracle_case *c = &cases[i];
        regex_dfa *d = compile_or_fail(c->pattern, c->min, c->max);
        if (!d)
            return;
        oracle o;
        CHECK_MSG(oracle_open(&o, c->pattern, c->min, c->max), "PCRE2 refuses '%s'",
                  c->pattern);
        for (int w = 0; w < walks; w++, total++) {
            char s[WALK_CAP];
            int n = walk(d, &rng, 1 + (int)(test_random(&rng) % 16), s);
            CHECK_MSG(n != -2, "'%s': nothing may follow '%.*s', which is not accepted",
                      c->pattern, WALK_CAP, s);
            if (n < 0)
                continue;
            ended++;
            long chars = utf8_chars((const uint8_t *)s, (size_t)n);
            CHECK_MSG(chars >= c->min && (uint64_t)chars <= c->max,
                      "'%s' [%u, %u]: '%.*s' has %ld characters", c->pattern, c->min, c->max,
                      n, s, chars);
            CHECK_MSG(oracle_says(&o, s, (size_t)n) == 1, "'%s': PCRE2 does not match '%.*s'",
                      c->pattern, n, s);
        }
        oracle_close(&o);
        regex_free(d);
    }
    printf("       %d of %d walks ended accepted\n", ended, total);
    CHECK(ended * 10 >= total * 9);
}

static regex_dfa *compile_timed(const char *pattern, uint32_t min, uint32_t max, double *ms)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    regex_dfa *d = compile_or_fail(pattern, min, max);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    printf("       %s [%u, %u]: %.1f ms\n", pattern, min, max, *ms);
    return d;
}

/* The largest automata stay quick to build: a long bound over any characters, and a
 * search whose rest may be empty once it has started (the match is then made: what
 * follows is anything, not a thousand places the match may have started at). */
static void big_automata_build_quickly(void)
{
    double ms, ms_search;
    regex_dfa *d = compile_timed("^[^<>]*$", 0, 1500, &ms);
    if (!d)
        return;
    char s[3 * 1501];
    for (int i = 0; i < 1501; i++)
        memcpy(s + 3 * i, "€", 3);
    CHECK(dfa_matches(d, s, 3 * 1500));
    CHECK(!dfa_matches(d, s, 3 * 1501));
    regex_free(d);
    d = compile_timed("x[^<]{0,1000}", 0, NO_MAX, &ms_search);
    if (!d)
        return;
    CHECK(dfa_matches(d, "<<x<", 4));
    CHECK(!dfa_matches(d, "<<<", 3));
    regex_free(d);
#ifndef TEST_SANITIZED
    CHECK_MSG(ms < 500 && ms_search < 50, "%.1f ms, %.1f ms", ms, ms_search);
#endif
}

int main(void)
{
    RUN(refusals_name_the_construct);
    RUN(patterns_are_counted_bytes);
    RUN(dead_stays_dead);
    RUN(strings_match_or_not);
    RUN(lengths_count_characters);
    RUN(agrees_with_pcre2);
    RUN(every_state_reaches_acceptance);
    RUN(random_walks_end_accepted);
    RUN(big_automata_build_quickly);
    return test_finish();
}
