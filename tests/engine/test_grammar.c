/*
 * grammar: GBNF grammars compiled and recognised byte by byte (engine/model/grammar.h).
 * Compile errors and their messages; llama.cpp's example grammars (the .gbnf files of tests/engine/data)
 * on sentences, prefixes and texts refused at a given byte; repetition counts; UTF-8 (any
 * character, negated classes, characters split across feeds, invalid bytes); random
 * grammars against an independent matcher written here over the same grammars' trees;
 * random walks that must never reach a dead end; the token table of real vocabularies
 * against feeding each token's bytes; and the recogniser's bounds.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf/gguf.h"
#include "engine/model/grammar.h"
#include "engine/tok/tokenizer.h"
#include "engine/tok/utf8.h"
#include "tests/support/test.h"

/* ---- helpers ---- */

/* Compiles text (NUL-terminated); NULL after a failure message when it is refused. */
static grammar *compile_text(const char *text, const char *what)
{
    char err[ERR_MAX] = "";
    grammar *g = NULL;
    if (grammar_compile(text, strlen(text), &g, err)) {
        test_fail(__FILE__, __LINE__, "%s refused: %s", what, err);
        return NULL;
    }
    return g;
}

/* A file of tests/engine/data, whole and NUL-terminated (NULL after a failure message). */
static char *read_data(const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "tests/engine/data/%s", name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        test_fail(__FILE__, __LINE__, "%s: cannot open (run from the repository)", path);
        return NULL;
    }
    char *text = malloc(1 << 16);
    size_t n = text ? fread(text, 1, (1 << 16) - 1, f) : 0;
    fclose(f);
    if (text)
        text[n] = '\0';
    return text;
}

static grammar *compile_file(const char *name)
{
    char *text = read_data(name);
    grammar *g = text ? compile_text(text, name) : NULL;
    free(text);
    return g;
}

static grammar_cursor *cursor_of(const grammar *g)
{
    char err[ERR_MAX];
    grammar_cursor *c = NULL;
    if (grammar_cursor_new(g, NULL, &c, err)) {
        test_fail(__FILE__, __LINE__, "cursor: %s", err);
        return NULL;
    }
    return c;
}

/* Feeds s[0..n) whole: 1 complete, 0 a prefix, -1 refused (-2: no cursor). */
static int verdict(const grammar *g, const char *s, size_t n)
{
    grammar_cursor *c = cursor_of(g);
    if (!c)
        return -2;
    int r = grammar_feed(c, s, n) ? -1 : grammar_complete(c) ? 1 : 0;
    grammar_cursor_free(c);
    return r;
}

/* The byte at which s is first refused, fed one byte at a time, or -1 (-2: no cursor). */
static long refused_at(const grammar *g, const char *s, size_t n)
{
    grammar_cursor *c = cursor_of(g);
    if (!c)
        return -2;
    long at = -1;
    for (size_t i = 0; i < n && at < 0; i++)
        if (grammar_feed(c, s + i, 1))
            at = (long)i;
    grammar_cursor_free(c);
    return at;
}

/* ---- compile errors ---- */

typedef struct refusal_case {
    const char *text;
    const char *message; /* a part of the error's text */
} refusal_case;

static void check_refused(const char *text, size_t n, const char *message)
{
    char err[ERR_MAX] = "";
    grammar *g = (grammar *)1;
    int rc = grammar_compile(text, n, &g, err);
    CHECK_MSG(rc == -1 && g == NULL, "'%.60s' compiled", text);
    CHECK_MSG(strstr(err, message) != NULL, "'%.60s': '%s' does not say '%s'", text, err, message);
    CHECK_MSG(strncmp(err, "grammar: ", 9) == 0, "'%s' has no prefix", err);
}

static void compile_errors(void)
{
    static const refusal_case cases[] = {
        {"", "the text has no rules"},
        {"  # only a comment\n\n", "the text has no rules"},
        {"root ::= foo", "undefined rule 'foo' at 1:10"},
        {"root ::= \"a\" foo\nfoo ::= bar\n", "undefined rule 'bar' at 2:9"},
        {"a ::= \"x\"", "no rule 'root'"},
        {"root ::= \"a\"\nroot ::= \"b\"", "rule 'root' defined twice, at 1:1 and 2:1"},
        /* left recursion: direct, indirect, through a rule matching the empty text,
         * through a group, and a repetition of what can match the empty text */
        {"root ::= root \"a\" | \"b\"", "left recursion: rule 'root' can begin with itself "
                                        "('root' -> 'root') at 1:1"},
        {"root ::= a\na ::= b \"x\"\nb ::= root | \"y\"",
         "left recursion: rule 'root' can begin with itself ('root' -> 'a' -> 'b' -> 'root') "
         "at 1:1"},
        {"root ::= e root \"x\" | \"y\"\ne ::= \"\" | \"z\"",
         "left recursion: rule 'root' can begin with itself ('root' -> 'root') at 1:1"},
        {"root ::= \"x\" a\na ::= (\"b\"? a) \"c\" | \"d\"",
         "left recursion: rule 'a' can begin with itself ('a' -> 'a') at 2:1"},
        {"root ::= x* \"y\"\nx ::= \"a\"?",
         "left recursion: the repetition at 1:11 repeats what can match the empty text"},
        {"root ::= (\"a\" | \"\")+", "the repetition at 1:20 repeats what can match the empty text"},
        /* escapes */
        {"root ::= \"\\q\"", "unknown escape '\\q' at 1:11"},
        {"root ::= \"\\x4\"", "'\\x' needs 2 hex digits at 1:11"},
        {"root ::= \"\\u12G4\"", "'\\u' needs 4 hex digits at 1:11"},
        {"root ::= [\\uD800]", "surrogate U+D800 at 1:11"},
        {"root ::= \"\\U00110000\"", "U+110000 is past U+10FFFF at 1:11"},
        /* unclosed and unmatched */
        {"root ::= \"abc", "unclosed string at 1:10"},
        {"root ::= [abc", "unclosed class at 1:10"},
        {"root ::= [a-", "unclosed class at 1:10"},
        {"root ::= (\"a\" | \"b\"", "unclosed '(' at 1:10"},
        {"root ::= (\"a\" (\"b\"\n)", "unclosed '(' at 1:10"},
        {"root ::= \"a\")", "unmatched ')' at 1:13"},
        /* repetitions */
        {"root ::= \"a\"{3,2}", "repetition {3,2} out of order at 1:13"},
        {"root ::= \"a\"{1001}", "count past GRAMMAR_REPEAT_MAX (1000) at 1:14"},
        {"root ::= \"a\"{2,99999999999999999999}", "count past GRAMMAR_REPEAT_MAX (1000) at 1:16"},
        {"root ::= \"a\"{,2}", "expected a count at 1:14"},
        {"root ::= \"a\"{2", "expected ',' or '}' at 1:15"},
        {"root ::= \"a\"{2,3", "expected '}' at 1:17"},
        {"root ::= *", "'*' repeats nothing at 1:10"},
        {"root ::= \"a\" | +", "'+' repeats nothing at 1:16"},
        {"root ::= (?)", "'?' repeats nothing at 1:11"},
        /* token references */
        {"root ::= <hello>", "token references (<...>) are not supported at 1:10"},
        {"root ::= \"a\" <[123]>", "token references (<...>) are not supported at 1:14"},
        /* classes */
        {"root ::= [z-a]", "range out of order at 1:11"},
        {"root ::= []", "empty class at 1:10"},
        {"root ::= [^]", "empty class at 1:10"},
        {"root ::= [^\\x00-\\U0010FFFF]", "class matches no character at 1:10"},
        /* structure */
        {"root = \"a\"", "expected '::=' after 'root' at 1:6"},
        {"root\n::= \"a\"", "expected '::=' after 'root' at 1:5"},
        {"::= \"a\"", "expected a rule name at 1:1"},
        {"root ::= \"a\"\n  | \"b\"", "expected a rule name at 2:3"},
        {"root ::= \"a\" \xc3\xa9", "unexpected '\xc3\xa9' at 1:14"},
        {"root ::= \"\xc3\"", "invalid UTF-8 at 1:11"},
        {"r\xc3\xa9sum\xc3\xa9 ::= \"\xe2\x82\xac\" \xff", "invalid UTF-8 at 1:16"},
        /* rules that never finish, when root needs them */
        {"root ::= \"a\" b\nb ::= \"x\" b", "rule 'b' at 2:1 never finishes"},
        {"root ::= \"a\" (\"x\" b)\nb ::= (\"y\" b)+", "rule 'b' at 2:1 never finishes"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        check_refused(cases[i].text, strlen(cases[i].text), cases[i].message);
    /* a NUL byte is no text */
    check_refused("root ::= \"a\0\"", 13, "a NUL byte at 1:12");
}

/* Texts past the limits: the text itself, nesting, rules, elements; and a start that
 * passes the recogniser's bounds. */
static void compile_limits(void)
{
    size_t cap = GRAMMAR_TEXT_MAX + 64;
    char *t = malloc(cap);
    CHECK(t);
    /* the text: a valid grammar one byte too long */
    size_t n = (size_t)snprintf(t, cap, "root ::= \"a\"\n");
    while (n < (size_t)GRAMMAR_TEXT_MAX + 1)
        t[n++] = '#';
    check_refused(t, n, "passes GRAMMAR_TEXT_MAX (262144)");
    /* parentheses: 64 open at once compile, 65 do not */
    for (int depth = 64; depth <= 65; depth++) {
        n = (size_t)snprintf(t, cap, "root ::= ");
        for (int i = 0; i < depth; i++)
            t[n++] = '(';
        t[n++] = '"', t[n++] = 'a', t[n++] = '"';
        for (int i = 0; i < depth; i++)
            t[n++] = ')';
        t[n] = '\0';
        if (depth == 64) {
            grammar *g = compile_text(t, "64 parentheses");
            CHECK(g);
            CHECK_EQ(verdict(g, "a", 1), 1);
            grammar_free(g);
        } else {
            check_refused(t, n, "parentheses nested deeper than 64 at 1:74");
        }
    }
    /* rules: each "a"{0,1000} makes 1000 of them */
    n = (size_t)snprintf(t, cap, "root ::= \"a\"\n");
    for (int i = 0; i < 70; i++)
        n += (size_t)snprintf(t + n, cap - n, "r%d ::= \"a\"{0,1000}\n", i);
    check_refused(t, n, "more than GRAMMAR_RULES_MAX (65536) rules at");
    /* elements: each "a"{1000} is 1000 of them */
    n = (size_t)snprintf(t, cap, "root ::= \"a\"\n");
    for (int i = 0; i < 1100; i++)
        n += (size_t)snprintf(t + n, cap - n, "r%d ::= \"a\"{1000}\n", i);
    check_refused(t, n, "more than GRAMMAR_ELEMENTS_MAX (1048576) elements at");
    /* 300 optional "a" at the start: 301 ways to read the first byte */
    n = (size_t)snprintf(t, cap, "root ::=");
    for (int i = 0; i < 300; i++)
        n += (size_t)snprintf(t + n, cap - n, " \"a\"?");
    n += (size_t)snprintf(t + n, cap - n, " \"b\"");
    check_refused(t, n, "its start needs more than GRAMMAR_STACKS_MAX (256) parse stacks");
    /* a rule matching the empty text in 2^13 ways */
    n = (size_t)snprintf(t, cap, "root ::= n13 \"x\"\nn0 ::= \"\" | \"\"\n");
    for (int i = 1; i <= 13; i++)
        n += (size_t)snprintf(t + n, cap - n, "n%d ::= n%d n%d\n", i, i - 1, i - 1);
    check_refused(t, n, "its start needs more than GRAMMAR_EXPAND_MAX (4096) expansions");
    free(t);
}

/* What llama.cpp's parser takes: names with digits, '-' and '_', a name right before '(',
 * '::=' without spaces, newlines inside parentheses and after '::=' and '|', comments
 * anywhere, CRLF, and a rule used before its definition. */
static void syntax_accepted(void)
{
    static const char text[] =
        "# a comment\r\n"
        "root::=item-1 (\r\n"
        "   \"-\" item-1   # inside parentheses\n"
        "   | sep_2 item-1\n"
        ")* end\n"
        "item-1 ::=\n"
        "  [0-9]+ |\n"
        "  \"x\"\n"
        "sep_2 ::= \",\" # the end of the rule\n"
        "end ::= \"!\"? # no newline at the end";
    grammar *g = compile_text(text, "the syntax sample");
    CHECK(g);
    CHECK_EQ(verdict(g, "12-x,3!", 7), 1);
    CHECK_EQ(verdict(g, "12-x,3", 6), 1);
    CHECK_EQ(verdict(g, "12-", 3), 0);
    CHECK_EQ(refused_at(g, "12--", 4), 3);
    CHECK_EQ(refused_at(g, "x!!", 3), 2);
    grammar_free(g);
}

/* ---- llama.cpp's example grammars ---- */

typedef struct refusal {
    const char *text;
    long at;
} refusal;

/* Each complete text is complete and every proper prefix of it taken; each prefix taken
 * and not complete; each refusal refused at its byte. */
static void check_table(const char *file, const char *const *complete, const char *const *prefix,
                        const refusal *refused)
{
    grammar *g = compile_file(file);
    CHECK(g);
    for (; *complete; complete++) {
        size_t n = strlen(*complete);
        CHECK_MSG(verdict(g, *complete, n) == 1, "%s: '%s' is not complete", file, *complete);
        for (size_t k = 0; k < n; k++)
            CHECK_MSG(verdict(g, *complete, k) >= 0, "%s: '%.*s' (a prefix of '%s') refused",
                      file, (int)k, *complete, *complete);
    }
    for (; *prefix; prefix++)
        CHECK_MSG(verdict(g, *prefix, strlen(*prefix)) == 0, "%s: '%s' is not a mere prefix",
                  file, *prefix);
    for (; refused->text; refused++) {
        long at = refused_at(g, refused->text, strlen(refused->text));
        CHECK_MSG(at == refused->at, "%s: '%s' refused at %ld, not %ld", file, refused->text,
                  at, refused->at);
    }
    grammar_free(g);
}

static void json_grammar(void)
{
    static const char *const complete[] = {
        "{}", "{} ", "{}\n\t\t", "{\"a\":1}", "{ \"a\" : [1, 2.5, -0, \"x\"] }",
        "{\"k\\u00e9y\": \"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\", \"e\": \"\\n\\u00FF\"}",
        "{\"a\":true,\"b\":false,\"c\":null}", "{\"a\":1.5e3}", "{\"a\":1234567890123456}",
        "{\"a\":{\"b\":[[],[{}]]}}", "{}\n                    ", NULL};
    static const char *const prefix[] = {"", "{", "{\"a", "{\"a\":", "{\"a\":[1,",
                                         "{\"a\":\"caf\xc3", "{\"a\":1.", "{\"a\":1e",
                                         "{\"a\":-", "{\"a\":\"\\u00e", NULL};
    static const refusal refused[] = {
        {"[]", 0}, {" {}", 0}, {"{}}", 2}, {"{} {}", 3}, {"{\"a\" 1}", 5},
        {"{\"a\":tru}", 8}, {"{\"a\":\"\x01\"}", 6}, {"{\"a\":\"\x7f\"}", 6},
        {"{\"a\":\"\\x\"}", 7}, {"{\"a\":\"\xc0\xaf\"}", 6}, {"{\"a\":\"\xed\xa0\x80\"}", 7},
        {"{\"a\":\"\xf4\x90\x80\x80\"}", 7}, {"{\"a\":\"\xe2\x82\"}", 8},
        {"{\"a\":12345678901234567}", 21}, /* [1-9] [0-9]{0,15}: 16 digits at most */
        {"{\"a\":1e10}", 8},               /* its exponent is [0-9] [1-9]{0,15} */
        {"{\"a\":01}", 6}, {"{}\n                     ", 23}, {NULL, 0}};
    check_table("json.gbnf", complete, prefix, refused);
}

static void other_grammars(void)
{
    {
        static const char *const complete[] = {"1+2=3\n", "(a +b1)*c_d =x\n", "1=1\n2=2\n",
                                               "x=y\n\n", NULL};
        static const char *const prefix[] = {"1", "1+", "(", "1=1", "1=1\nx", NULL};
        static const refusal refused[] = {{"=1\n", 0}, {"1+\n", 2}, {"A=1\n", 0},
                                          {"1==2", 2}, {"a + b=1\n", 3}, {NULL, 0}};
        check_table("arithmetic.gbnf", complete, prefix, refused);
    }
    {
        static const char *const complete[] = {"- a\n", "- caf\xc3\xa9\n- b\n", NULL};
        static const char *const prefix[] = {"", "- ", "- a", "- a\n- ", NULL};
        static const refusal refused[] = {{"-a", 1}, {"- \n", 2}, {"- a\r", 3},
                                          {"- a\xc2\x85", 4}, {"- a\xe2\x80\xa8", 5},
                                          {"- a\xe2\x80\xa9", 5}, {NULL, 0}};
        check_table("list.gbnf", complete, prefix, refused);
    }
    {
        static const char *const complete[] = {"1. e4 e5\n2. Nf3 Nc6\n",
                                               "1. O-O O-O-O\n2. a1=Q+ Kxh8#\n10. exd5 Qxd5\n",
                                               NULL};
        static const char *const prefix[] = {"1. e4 e5\n", "1. e4 e5\n2", NULL};
        static const refusal refused[] = {{"1. e9", 4}, {"2. e4", 0}, {"1. e4 e5\n0", 9},
                                          {"1. e4  e5", 6}, {NULL, 0}};
        check_table("chess.gbnf", complete, prefix, refused);
    }
    {
        static const char *const complete[] = {"Hello, world!", "a[\\]^_`{|}~\n-", NULL};
        static const char *const prefix[] = {"", "a ", NULL};
        static const refusal refused[] = {{"Hello  world", 6}, {" x", 0},
                                          {"caf\xc3\xa9", 3}, {NULL, 0}};
        check_table("english.gbnf", complete, prefix, refused);
    }
    {
        static const char *const complete[] = {
            "\xe3\x81\x93\xe3\x82\x93\xe3\x81\xab\xe3\x81\xa1\xe3\x81\xaf\xe3\x80\x81"
            "\xe4\xb8\x96\xe7\x95\x8c",
            "\xe3\x82\xab \xe9\xbf\xbf", NULL};
        static const char *const prefix[] = {"", "\xe3\x81", "\xe3\x81\x93\n", NULL};
        static const refusal refused[] = {{"abc", 0}, {"\xe3\x81\x93 a", 4},
                                          {"\xe3\x81\x80", 2} /* U+3040 */, {NULL, 0}};
        check_table("japanese.gbnf", complete, prefix, refused);
    }
    {
        static const char *const complete[] = {
            "", "int main(){return 0;}", "int f(int x){x = x+1;}",
            "float g(){while(a<b){b = b-1;}if(a==b){return a*2;}else{c (1, 2);}}",
            "char h(){// note\n/* a * b */}", NULL};
        static const char *const prefix[] = {"int", "int main(", "int main(){/* x", NULL};
        static const refusal refused[] = {{"int main (){}", 8}, {"main(){}", 0},
                                          {"int main(){return 0}", 19}, {NULL, 0}};
        check_table("c.gbnf", complete, prefix, refused);
    }
    {
        static const char *const complete[] = {"[\n1]", "[\n{\"a\": [1, 2]},\n\"x\"]", NULL};
        static const char *const prefix[] = {"[\n", NULL};
        static const refusal refused[] = {{"[1]", 1}, {"[\n1] ", 4}, {NULL, 0}};
        check_table("json_arr.gbnf", complete, prefix, refused);
    }
}

/* ---- repetitions ---- */

/* x{m,n} takes from m to n copies, exactly; also over a group, a class and a rule, and
 * nested. */
static void repetition_counts(void)
{
    static const struct {
        const char *text;
        int min, max; /* of 'a's; max -1: no bound (checked to 40) */
    } cases[] = {
        {"root ::= \"a\"{3}", 3, 3},      {"root ::= \"a\"{2,}", 2, -1},
        {"root ::= \"a\"{2,5}", 2, 5},    {"root ::= \"a\"{0,4}", 0, 4},
        {"root ::= \"a\"{0}", 0, 0},      {"root ::= \"a\"*", 0, -1},
        {"root ::= \"a\"+", 1, -1},       {"root ::= \"a\"?", 0, 1},
        {"root ::= [a]{ 1 , 3 }", 1, 3},  {"root ::= (\"a\"){4,6}", 4, 6},
        {"root ::= x{2,3}\nx ::= \"a\"", 2, 3},
        {"root ::= (\"a\" \"a\"?){2}", 2, 4}, {"root ::= \"a\"{0,1000}", 0, 1000},
        {"root ::= \"a\"{1000}", 1000, 1000},
    };
    char text[1100];
    memset(text, 'a', sizeof text);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        grammar *g = compile_text(cases[i].text, cases[i].text);
        CHECK(g);
        int top = cases[i].max < 0 ? 40 : cases[i].max + 2;
        for (int k = 0; k <= top && k < (int)sizeof text; k++) {
            bool whole = k >= cases[i].min && (cases[i].max < 0 || k <= cases[i].max);
            int want = whole ? 1 : cases[i].max >= 0 && k > cases[i].max ? -1 : 0;
            int got = verdict(g, text, (size_t)k);
            CHECK_MSG(got == want, "%s on %d 'a': %d, not %d", cases[i].text, k, got, want);
        }
        grammar_free(g);
    }
    /* nested counts multiply: 4 or 6 */
    grammar *g = compile_text("root ::= (\"a\"{2}){2,3}", "nested");
    CHECK(g);
    for (int k = 0; k <= 8; k++)
        CHECK_EQ(verdict(g, text, (size_t)k), k == 4 || k == 6 ? 1 : k > 6 ? -1 : 0);
    grammar_free(g);
    /* a literal of several characters repeats whole */
    g = compile_text("root ::= \"ab\"{2} \"c\"", "\"ab\"{2}");
    CHECK(g);
    CHECK_EQ(verdict(g, "ababc", 5), 1);
    CHECK_EQ(refused_at(g, "abac", 4), 3);
    CHECK_EQ(refused_at(g, "abc", 3), 2);
    grammar_free(g);
}

/* ---- UTF-8 ---- */

/* '.' takes every valid character, of each length, also split across feeds; negated
 * classes take every character but theirs; nothing takes invalid UTF-8. */
static void utf8_characters(void)
{
    grammar *any = compile_text("root ::= . .", "any");
    grammar *neg = compile_text("root ::= [^a\xc3\xa9\xe2\x82\xac-\xe2\x82\xaf\\U0001F600]+",
                                "negated");
    CHECK(any && neg);
    static const char *const chars[] = {"a", "\x7f", "\xc2\x80", "\xc3\xa9", "\xdf\xbf",
                                        "\xe0\xa0\x80", "\xe2\x82\xac", "\xed\x9f\xbf",
                                        "\xee\x80\x80", "\xef\xbf\xbf", "\xf0\x90\x80\x80",
                                        "\xf0\x9f\x98\x80", "\xf4\x8f\xbf\xbf"};
    for (size_t i = 0; i < sizeof chars / sizeof *chars; i++)
        for (size_t j = 0; j < sizeof chars / sizeof *chars; j++) {
            char two[8];
            size_t a = strlen(chars[i]), b = strlen(chars[j]);
            memcpy(two, chars[i], a);
            memcpy(two + a, chars[j], b);
            CHECK_EQ(verdict(any, two, a + b), 1);
            /* byte by byte, as tokens would split it */
            grammar_cursor *c = cursor_of(any);
            CHECK(c);
            for (size_t k = 0; k < a + b; k++) {
                CHECK(grammar_feed(c, two + k, 1) == 0);
                CHECK_EQ(grammar_complete(c), k == a + b - 1);
            }
            CHECK(grammar_finished(c));
            grammar_cursor_free(c);
        }
    /* the negated class: é, U+20AC-U+20AF, U+1F600 and 'a' out; their neighbours in */
    static const char others[] = "b\xc3\xa8\xc3\xaa\xe2\x82\xab\xe2\x82\xb0\xf0\x9f\x98\x81";
    CHECK_EQ(verdict(neg, others, sizeof others - 1), 1);
    CHECK_EQ(refused_at(neg, "ba", 2), 1);
    CHECK_EQ(refused_at(neg, "b\xc3\xa9", 3), 2);
    CHECK_EQ(refused_at(neg, "\xe2\x82\xae", 3), 2);
    CHECK_EQ(refused_at(neg, "\xf0\x9f\x98\x80", 4), 3);
    CHECK_EQ(verdict(neg, "\n\x01", 2), 1); /* controls are characters too */
    /* invalid UTF-8: overlong forms, surrogates, past U+10FFFF, stray continuation bytes,
     * bytes that are never UTF-8, a lead byte cut short */
    static const refusal bad[] = {
        {"\xc0\x80", 0}, {"\xc1\xbf", 0}, {"\xe0\x9f\xbf", 1}, {"\xed\xa0\x80", 1},
        {"\xed\xbf\xbf", 1}, {"\xf0\x8f\xbf\xbf", 1}, {"\xf4\x90\x80\x80", 1},
        {"\xf5\x80\x80\x80", 0}, {"\x80", 0}, {"\xbf", 0}, {"\xfe", 0}, {"\xff", 0},
        {"\xc3" "a", 1}, {"\xe2\x82" "a", 2}, {"b\x80", 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        size_t n = strlen(bad[i].text);
        CHECK_MSG(refused_at(any, bad[i].text, n) == bad[i].at, "'.' takes invalid %zu", i);
        CHECK_MSG(refused_at(neg, bad[i].text, n) == bad[i].at, "[^...] takes invalid %zu", i);
    }
    /* escapes name code points: \xE9 is U+00E9, two bytes */
    grammar *esc = compile_text("root ::= \"\\xE9\\u20AC\\U0001F600\\t\\\\\\\"\\[\\]\\-\\^\"",
                                "escapes");
    CHECK(esc);
    static const char want[] = "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\t\\\"[]-^";
    CHECK_EQ(verdict(esc, want, sizeof want - 1), 1);
    CHECK_EQ(refused_at(esc, "\xe9", 1), 0);
    grammar_free(esc);
    grammar_free(any);
    grammar_free(neg);
}

/* A class's ranges, escapes inside it, and '-' and '^' as themselves. */
static void classes(void)
{
    grammar *g = compile_text("root ::= [-a-c^\\]\\\\x-]+", "class");
    CHECK(g);
    CHECK_EQ(verdict(g, "-abc^]\\x", 8), 1);
    CHECK_EQ(refused_at(g, "abd", 3), 2);
    grammar_free(g);
    g = compile_text("root ::= [\\^a] [\\-] [\\x41-\\x43]", "escaped");
    CHECK(g);
    CHECK_EQ(verdict(g, "^-B", 3), 1);
    CHECK_EQ(verdict(g, "a-C", 3), 1);
    CHECK_EQ(refused_at(g, "a-D", 3), 2);
    grammar_free(g);
}

/* ---- cursors ---- */

/* Refused feeds and tokens leave the cursor as it was; reset starts again; copy carries
 * the state; completion and the end. */
static void cursor_state(void)
{
    grammar *g = compile_text("root ::= \"ab\" \"c\"?", "abc");
    grammar *other = compile_text("root ::= \"x\"", "x");
    CHECK(g && other);
    grammar_cursor *c = cursor_of(g), *d = cursor_of(g), *e = cursor_of(other);
    CHECK(c && d && e);
    CHECK(!grammar_complete(c) && !grammar_finished(c) && !grammar_bounded(c));
    CHECK_EQ(grammar_feed(c, "a", 1), 0);
    CHECK_EQ(grammar_feed(c, "bx", 2), -1); /* unchanged: 'b' still comes next */
    CHECK_EQ(grammar_feed(c, "", 0), 0);
    CHECK(!grammar_complete(c));
    CHECK_EQ(grammar_feed(c, "b", 1), 0);
    CHECK(grammar_complete(c) && !grammar_finished(c));
    CHECK_EQ(grammar_cursor_copy(d, c), 0);
    CHECK_EQ(grammar_cursor_copy(e, c), -1);
    CHECK_EQ(grammar_feed(d, "c", 1), 0);
    CHECK(grammar_finished(d));
    CHECK_EQ(grammar_feed(d, "c", 1), -1);
    CHECK(grammar_complete(c) && !grammar_finished(c)); /* c untouched by d */
    grammar_cursor_reset(c);
    CHECK(!grammar_complete(c));
    CHECK_EQ(grammar_feed(c, "abc", 3), 0);
    CHECK(grammar_finished(c));
    /* no vocabulary: no token is allowed */
    CHECK(!grammar_allows(c, 0));
    CHECK_EQ(grammar_take(c, 0), -1);
    grammar_cursor_free(c);
    grammar_cursor_free(d);
    grammar_cursor_free(e);
    grammar_cursor_free(NULL);
    grammar_free(g);
    grammar_free(other);
    grammar_free(NULL);
}

/* ---- the recogniser's bounds ---- */

static void bounds(void)
{
    char *t = malloc(8192);
    CHECK(t);
    /* after "x", 300 ways to read on: the byte is refused, the start a dead end */
    size_t n = (size_t)snprintf(t, 8192, "root ::= \"x\" t\nt ::=");
    for (int i = 0; i < 300; i++)
        n += (size_t)snprintf(t + n, 8192 - n, " \"a\"?");
    grammar *g = compile_text(t, "300 optional");
    CHECK(g);
    grammar_cursor *c = cursor_of(g);
    CHECK(c);
    CHECK(grammar_bounded(c));
    CHECK_EQ(grammar_feed(c, "x", 1), -1);
    CHECK(!grammar_complete(c) && !grammar_finished(c));
    grammar_cursor_free(c);
    grammar_free(g);
    /* 200 optional "a": ambiguous, within the bounds: 200 'a' and a 'b' complete */
    n = (size_t)snprintf(t, 8192, "root ::=");
    for (int i = 0; i < 200; i++)
        n += (size_t)snprintf(t + n, 8192 - n, " \"a\"?");
    snprintf(t + n, 8192 - n, " \"b\"");
    g = compile_text(t, "200 optional");
    CHECK(g);
    memset(t, 'a', 201);
    t[200] = 'b';
    CHECK_EQ(verdict(g, t, 201), 1);
    CHECK_EQ(refused_at(g, t, 201), -1);
    t[200] = 'a';
    CHECK_EQ(refused_at(g, t, 201), 200);
    grammar_free(g);
    /* nesting: '(' is refused once a stack would pass GRAMMAR_DEPTH_MAX, the rest goes on */
    g = compile_text("root ::= \"(\" root \")\" | \"x\"", "parentheses");
    CHECK(g);
    c = cursor_of(g);
    CHECK(c);
    int opened = 0;
    while (opened < 1000 && grammar_feed(c, "(", 1) == 0)
        opened++;
    CHECK_MSG(opened >= GRAMMAR_DEPTH_MAX - 2 && opened <= GRAMMAR_DEPTH_MAX, "%d opened", opened);
    CHECK(grammar_bounded(c));
    CHECK_EQ(grammar_feed(c, "x", 1), 0);
    CHECK(!grammar_bounded(c));
    for (int i = 0; i < opened; i++)
        CHECK_EQ(grammar_feed(c, ")", 1), 0);
    CHECK(grammar_finished(c));
    grammar_cursor_free(c);
    grammar_free(g);
    free(t);
}

/* A list of a thousand words (llama.cpp's JSON Schema enums, keywords): alternatives that
 * begin alike are read as one, so the list stays far within GRAMMAR_STACKS_MAX at its
 * start and all along. */
static void thousand_words(void)
{
    size_t cap = 64 * 1024, n = 0;
    char *t = malloc(cap);
    CHECK(t);
    n += (size_t)snprintf(t + n, cap - n, "root ::= \"color: \" color \".\"\ncolor ::= ");
    for (int i = 0; i < 1000; i++)
        n += (size_t)snprintf(t + n, cap - n, "%s\"%s%d\"", i ? " | " : "",
                              i % 3 == 0 ? "dark-" : i % 3 == 1 ? "deep-" : "", i * 7 % 1000);
    grammar *g = compile_text(t, "a thousand words");
    free(t);
    CHECK(g);
    CHECK_EQ(verdict(g, "color: dark-0.", 14), 1);
    CHECK_EQ(verdict(g, "color: deep-7.", 14), 1);
    CHECK_EQ(verdict(g, "color: 14.", 10), 1);
    CHECK_EQ(verdict(g, "color: 1", 8), 0);
    CHECK_EQ(refused_at(g, "color: dark-7.", 14), 13); /* 7 * 1 is deep- */
    CHECK_EQ(refused_at(g, "color: dim", 10), 8);
    grammar_cursor *c = cursor_of(g);
    CHECK(c);
    CHECK_EQ(grammar_feed(c, "color: ", 7), 0);
    CHECK(!grammar_bounded(c));
    for (const char *s = "deep-994."; *s; s++) {
        CHECK_EQ(grammar_feed(c, s, 1), 0);
        CHECK(!grammar_bounded(c));
    }
    CHECK(grammar_finished(c));
    grammar_cursor_free(c);
    grammar_free(g);
}

/* ---- random grammars against a matcher of their trees ---- */

enum { N_CHARS, N_SEQ, N_ALT, N_REF, N_REP };

#define MAX_NODES 400
#define MAX_RULES 5
#define MAX_KIDS 4
#define MAX_CHARS 30 /* code points of a text the matcher takes */

typedef struct node {
    int kind;
    int n_kids, kid[MAX_KIDS]; /* N_SEQ, N_ALT: the items; N_REP: kid[0] */
    int n_ranges;              /* N_CHARS: the class's code points lo[i]..hi[i] */
    uint32_t lo[3], hi[3];
    bool negated;  /* N_CHARS: [^...] */
    bool literal;  /* N_CHARS: written as a literal (one character) */
    bool any;      /* N_CHARS: written '.' */
    int rule;      /* N_REF */
    int min, max;  /* N_REP: the counts (max -1: no bound) */
    char op;       /* N_REP: how it is written: * + ? or { */
} node;

typedef struct tree {
    node nodes[MAX_NODES];
    int n_nodes;
    int body[MAX_RULES]; /* each rule's node */
    int n_rules;
    uint64_t *rng;
} tree;

/* The characters random grammars and texts are made of: every UTF-8 length. */
static const uint32_t alphabet[] = {'a', 'b', 'c', '\n', 0xE9, 0x20AC, 0x1F600};
#define N_ALPHABET (sizeof alphabet / sizeof *alphabet)

static int rnd(tree *t, int n)
{
    return (int)(test_random(t->rng) % (uint64_t)n);
}

static int new_node(tree *t, int kind)
{
    if (t->n_nodes == MAX_NODES)
        return -1;
    node *x = &t->nodes[t->n_nodes];
    memset(x, 0, sizeof *x);
    x->kind = kind;
    return t->n_nodes++;
}

static int gen_expr(tree *t, int depth)
{
    int r = rnd(t, 100), id;
    if (depth >= 3 || r < 45) {
        int leaf = rnd(t, 100);
        if (leaf < 14) {
            if ((id = new_node(t, N_REF)) >= 0)
                t->nodes[id].rule = rnd(t, t->n_rules);
            return id;
        }
        if ((id = new_node(t, N_CHARS)) < 0)
            return -1;
        node *x = &t->nodes[id];
        if (leaf < 64) {
            x->literal = true;
            x->n_ranges = 1;
            x->lo[0] = x->hi[0] = alphabet[rnd(t, N_ALPHABET)];
        } else if (leaf < 70) {
            x->any = true;
            x->n_ranges = 1;
            x->lo[0] = 0, x->hi[0] = 0x10FFFF;
        } else {
            x->negated = rnd(t, 3) == 0;
            x->n_ranges = 1 + rnd(t, 3);
            for (int i = 0; i < x->n_ranges; i++) {
                uint32_t a = alphabet[rnd(t, N_ALPHABET)], b = alphabet[rnd(t, N_ALPHABET)];
                x->lo[i] = a < b ? a : b;
                x->hi[i] = rnd(t, 2) ? x->lo[i] : (a < b ? b : a);
            }
        }
        return id;
    }
    if (r < 70) {
        int kind = r < 58 ? N_SEQ : N_ALT;
        if ((id = new_node(t, kind)) < 0)
            return -1;
        int n = (kind == N_SEQ ? 1 : 2) + rnd(t, 3);
        for (int i = 0; i < n && i < MAX_KIDS; i++) {
            int k = gen_expr(t, depth + 1);
            if (k < 0)
                return -1;
            t->nodes[id].kid[t->nodes[id].n_kids++] = k;
        }
        return id;
    }
    if ((id = new_node(t, N_REP)) < 0)
        return -1;
    int k = gen_expr(t, depth + 1);
    if (k < 0)
        return -1;
    node *x = &t->nodes[id];
    x->kid[0] = k;
    x->n_kids = 1;
    static const char ops[] = "*+?{{{";
    x->op = ops[rnd(t, 6)];
    x->min = x->op == '+' ? 1 : x->op == '{' ? rnd(t, 3) : 0;
    x->max = x->op == '?' ? 1 : x->op == '{' ? (rnd(t, 3) ? x->min + rnd(t, 3) : -1) : -1;
    return id;
}

static void put(char *out, size_t *n, size_t cap, const char *s)
{
    size_t k = strlen(s);
    if (*n + k < cap) {
        memcpy(out + *n, s, k);
        *n += k;
    }
    out[*n < cap ? *n : cap - 1] = '\0';
}

/* A character inside a literal or a class: escaped where it must be, else sometimes. */
static void put_char(tree *t, char *out, size_t *n, size_t cap, uint32_t cp, bool in_class)
{
    char buf[16];
    if (cp == '\n')
        snprintf(buf, sizeof buf, "\\n");
    else if (cp == '"' || cp == '\\' || (in_class && (cp == ']' || cp == '-' || cp == '^')))
        snprintf(buf, sizeof buf, "\\%c", (char)cp);
    else if (cp >= 0x80 && rnd(t, 3) == 0)
        snprintf(buf, sizeof buf, cp > 0xFFFF ? "\\U%08X" : "\\u%04X", cp);
    else if (cp < 0x20 || cp == 0x10FFFF)
        snprintf(buf, sizeof buf, "\\U%08X", cp);
    else
        buf[utf8_encode(cp, buf)] = '\0';
    put(out, n, cap, buf);
}

/* Spacing between items: spaces, and inside parentheses newlines and comments too. */
static void put_space(tree *t, char *out, size_t *n, size_t cap, bool nested)
{
    int r = rnd(t, 10);
    put(out, n, cap, !nested || r < 7 ? " " : r < 9 ? "\n  " : " # note\n ");
}

static void render(tree *t, int id, char *out, size_t *n, size_t cap, bool nested);

static void render_item(tree *t, int id, char *out, size_t *n, size_t cap)
{
    const node *x = &t->nodes[id];
    if (x->kind == N_SEQ || x->kind == N_ALT || x->kind == N_REP) {
        put(out, n, cap, "(");
        render(t, id, out, n, cap, true);
        put(out, n, cap, ")");
    } else {
        render(t, id, out, n, cap, true);
    }
}

static void render(tree *t, int id, char *out, size_t *n, size_t cap, bool nested)
{
    const node *x = &t->nodes[id];
    char buf[32];
    switch (x->kind) {
    case N_CHARS:
        if (x->any) {
            put(out, n, cap, ".");
        } else if (x->literal) {
            put(out, n, cap, "\"");
            put_char(t, out, n, cap, x->lo[0], false);
            put(out, n, cap, "\"");
        } else {
            put(out, n, cap, x->negated ? "[^" : "[");
            for (int i = 0; i < x->n_ranges; i++) {
                put_char(t, out, n, cap, x->lo[i], true);
                if (x->hi[i] != x->lo[i]) {
                    put(out, n, cap, "-");
                    put_char(t, out, n, cap, x->hi[i], true);
                }
            }
            put(out, n, cap, "]");
        }
        break;
    case N_SEQ:
        for (int i = 0; i < x->n_kids; i++) {
            if (i)
                put_space(t, out, n, cap, nested);
            render_item(t, x->kid[i], out, n, cap);
        }
        break;
    case N_ALT:
        for (int i = 0; i < x->n_kids; i++) {
            if (i)
                put(out, n, cap, rnd(t, 4) ? " | " : " |\n    ");
            if (t->nodes[x->kid[i]].kind == N_ALT)
                render_item(t, x->kid[i], out, n, cap);
            else
                render(t, x->kid[i], out, n, cap, nested);
        }
        break;
    case N_REF:
        snprintf(buf, sizeof buf, x->rule == 0 ? "root" : "r%s%d", x->rule % 2 ? "-" : "_",
                 x->rule);
        put(out, n, cap, buf);
        break;
    case N_REP:
        render_item(t, x->kid[0], out, n, cap);
        if (x->op != '{')
            snprintf(buf, sizeof buf, "%c", x->op);
        else if (x->max < 0)
            snprintf(buf, sizeof buf, "{%d,}", x->min);
        else if (x->max == x->min && rnd(t, 2))
            snprintf(buf, sizeof buf, "{%d}", x->min);
        else
            snprintf(buf, sizeof buf, "{%d,%d}", x->min, x->max);
        put(out, n, cap, buf);
        break;
    }
}

/* A random grammar of 1..MAX_RULES rules; false when it outgrew the tree. */
static bool gen_tree(tree *t, char *text, size_t cap)
{
    t->n_nodes = 0;
    t->n_rules = 1 + rnd(t, MAX_RULES);
    size_t n = 0;
    text[0] = '\0';
    for (int r = 0; r < t->n_rules; r++)
        if ((t->body[r] = gen_expr(t, 0)) < 0)
            return false;
    for (int r = 0; r < t->n_rules; r++) {
        char head[32];
        snprintf(head, sizeof head, r == 0 ? "root ::= " : "r%s%d ::= ", r % 2 ? "-" : "_", r);
        put(text, &n, cap, head);
        if (t->nodes[t->body[r]].kind == N_SEQ && t->nodes[t->body[r]].n_kids == 0)
            put(text, &n, cap, "\"\"");
        render(t, t->body[r], text, &n, cap, false);
        put(text, &n, cap, "\n");
    }
    return n + 1 < cap;
}

/* What a node matches of cps[i..n): ends, bit j when it matches cps[i..j); more, when
 * cps[i..n) is a proper prefix of something it matches. */
typedef struct match {
    uint32_t ends;
    bool more;
} match;

typedef struct matcher {
    const tree *t;
    const uint32_t *cps;
    int n;
    match memo[MAX_RULES][MAX_CHARS + 1];
    uint8_t state[MAX_RULES][MAX_CHARS + 1]; /* 0 unknown, 1 in progress, 2 known */
    bool looped;                             /* a rule called itself at the same place */
} matcher;

static bool class_has(const node *x, uint32_t cp)
{
    bool in = false;
    for (int i = 0; i < x->n_ranges; i++)
        in |= cp >= x->lo[i] && cp <= x->hi[i];
    return in != x->negated;
}

static match match_node(matcher *m, int id, int i);

static match match_rule(matcher *m, int r, int i)
{
    if (m->state[r][i] == 1) {
        m->looped = true;
        return (match){0, false};
    }
    if (m->state[r][i] == 0) {
        m->state[r][i] = 1;
        m->memo[r][i] = match_node(m, m->t->body[r], i);
        m->state[r][i] = 2;
    }
    return m->memo[r][i];
}

static match match_node(matcher *m, int id, int i)
{
    const node *x = &m->t->nodes[id];
    match out = {0, false};
    switch (x->kind) {
    case N_CHARS:
        if (i == m->n)
            out.more = true;
        else if (class_has(x, m->cps[i]))
            out.ends = 1u << (i + 1);
        return out;
    case N_REF:
        return match_rule(m, x->rule, i);
    case N_ALT:
        for (int k = 0; k < x->n_kids; k++) {
            match a = match_node(m, x->kid[k], i);
            out.ends |= a.ends;
            out.more |= a.more;
        }
        return out;
    case N_SEQ: {
        uint32_t at = 1u << i;
        for (int k = 0; k < x->n_kids; k++) {
            uint32_t next = 0;
            for (int p = 0; p <= m->n; p++)
                if (at >> p & 1) {
                    match a = match_node(m, x->kid[k], p);
                    next |= a.ends;
                    out.more |= a.more;
                }
            at = next;
        }
        out.ends = at;
        return out;
    }
    case N_REP: {
        /* positions after exactly k copies; from min copies on, every further copy's
         * ends count too (a closure for an unbounded count) */
        uint32_t at = 1u << i, seen = 0;
        for (int k = 0;; k++) {
            if (k >= x->min) {
                at &= ~seen;
                seen |= at;
            }
            if (!at || (x->max >= 0 && k == x->max))
                break;
            uint32_t next = 0;
            for (int p = 0; p <= m->n; p++)
                if (at >> p & 1) {
                    match a = match_node(m, x->kid[0], p);
                    next |= a.ends;
                    out.more |= a.more;
                }
            at = next;
            if (k > 2 * MAX_CHARS + 8 && x->max < 0 && k >= x->min)
                break;
        }
        out.ends = seen;
        return out;
    }
    }
    return out;
}

/* The matcher's verdict on cps[0..n): 1 a sentence, 0 a proper prefix of one, -1 neither. */
static int oracle(const tree *t, const uint32_t *cps, int n, bool *looped)
{
    static matcher m;
    memset(&m, 0, sizeof m);
    m.t = t;
    m.cps = cps;
    m.n = n;
    match a = match_rule(&m, 0, 0);
    *looped |= m.looped;
    return a.ends >> n & 1 ? 1 : a.more ? 0 : -1;
}

/* The code points of valid UTF-8 text (at most MAX_CHARS); -1 when it is not whole. */
static int decode(const char *s, size_t n, uint32_t *cps)
{
    int k = 0;
    for (size_t i = 0; i < n;) {
        int len = utf8_seq(s + i, n - i);
        if (len <= 0 || k == MAX_CHARS)
            return -1;
        const unsigned char *u = (const unsigned char *)s + i;
        uint32_t cp = len == 1 ? u[0] : len == 2 ? u[0] & 0x1Fu : len == 3 ? u[0] & 0x0Fu : u[0] & 0x07u;
        for (int j = 1; j < len; j++)
            cp = cp << 6 | (u[j] & 0x3Fu);
        cps[k++] = cp;
        i += (size_t)len;
    }
    return k;
}

/* The bytes c takes next, by feeding each to a copy (probe). */
static void next_bytes(grammar_cursor *c, grammar_cursor *probe, bool ok[256])
{
    for (int b = 0; b < 256; b++) {
        grammar_cursor_copy(probe, c);
        uint8_t byte = (uint8_t)b;
        ok[b] = grammar_feed(probe, &byte, 1) == 0;
    }
}

typedef struct oracle_stats {
    int grammars, refused, texts, walks, sentences, bounded;
} oracle_stats;

/* Every prefix of text (whole characters, to MAX_CHARS) gets the cursor's verdict the
 * matcher gives. */
static void compare_text(const tree *t, const grammar *g, const char *text, size_t n,
                         const char *gtext, oracle_stats *st)
{
    uint32_t cps[MAX_CHARS];
    grammar_cursor *c = cursor_of(g);
    CHECK(c);
    bool refused = false, looped = false;
    size_t at = 0;
    for (int k = 0;; k++) {
        int want = oracle(t, cps, k, &looped), got = refused ? -1 : grammar_complete(c) ? 1 : 0;
        CHECK_MSG(!looped, "the matcher looped: left recursion compiled?\n%s", gtext);
        CHECK_MSG(got == want, "'%.*s': %d, the matcher says %d; grammar:\n%s", (int)at, text,
                  got, want, gtext);
        int len = at < n ? utf8_seq(text + at, n - at) : 0;
        if (refused || len <= 0 || k == MAX_CHARS)
            break;
        if (decode(text + at, (size_t)len, cps + k) != 1)
            break;
        bool bounded = grammar_bounded(c);
        refused = grammar_feed(c, text + at, (size_t)len) != 0;
        at += (size_t)len;
        if (refused && bounded) {
            st->bounded++;
            break;
        }
    }
    st->texts++;
    grammar_cursor_free(c);
}

/* Random texts: over the alphabet, and a few sentences the cursor's random walk wrote,
 * also changed by a character. */
static void random_texts(const tree *t, const grammar *g, const char *gtext, uint64_t *rng,
                         oracle_stats *st)
{
    char text[MAX_CHARS * 4 + 1];
    for (int r = 0; r < 12; r++) {
        size_t n = 0;
        int chars = (int)(test_random(rng) % 9);
        for (int i = 0; i < chars; i++)
            n += utf8_encode(alphabet[test_random(rng) % N_ALPHABET], text + n);
        compare_text(t, g, text, n, gtext, st);
    }
    grammar_cursor *c = cursor_of(g), *probe = cursor_of(g);
    CHECK(c && probe);
    for (int w = 0; w < 6; w++) {
        /* a walk: random bytes among those taken, until complete and chosen to stop, or
         * MAX_CHARS characters; it must never meet a dead end */
        grammar_cursor_reset(c);
        size_t n = 0;
        int chars = 0;
        bool ok[256];
        for (;;) {
            next_bytes(c, probe, ok);
            int n_ok = 0;
            for (int b = 0; b < 256; b++)
                n_ok += ok[b];
            CHECK_MSG(n_ok > 0 || grammar_complete(c) || grammar_bounded(c),
                      "a dead end after '%.*s'; grammar:\n%s", (int)n, text, gtext);
            CHECK_EQ(grammar_finished(c), n_ok == 0 && grammar_complete(c));
            if (n_ok == 0 || (grammar_complete(c) && test_random(rng) % 4 == 0) ||
                chars == MAX_CHARS - 1)
                break;
            int pick = (int)(test_random(rng) % (uint64_t)n_ok), b = 0;
            for (;; b++)
                if (ok[b] && pick-- == 0)
                    break;
            uint8_t byte = (uint8_t)b;
            CHECK_EQ(grammar_feed(c, &byte, 1), 0);
            text[n++] = (char)byte;
            chars += (byte & 0xC0) != 0x80;
            if (n + 4 >= sizeof text)
                break;
        }
        st->walks++;
        uint32_t cps[MAX_CHARS];
        int k = decode(text, n, cps);
        if (k >= 0 && grammar_complete(c)) {
            bool looped = false;
            CHECK_MSG(oracle(t, cps, k, &looped) == 1, "walk '%.*s' complete, the matcher "
                      "disagrees; grammar:\n%s", (int)n, text, gtext);
            st->sentences++;
        }
        compare_text(t, g, text, n, gtext, st);
        if (k > 0) {
            /* the sentence with one character replaced, deleted or added */
            int at = (int)(test_random(rng) % (uint64_t)k), op = (int)(test_random(rng) % 3);
            char changed[sizeof text + 4];
            size_t m = 0;
            for (int i = 0; i <= k; i++) {
                if (i == at && op != 1)
                    m += utf8_encode(alphabet[test_random(rng) % N_ALPHABET], changed + m);
                if (i < k && !(i == at && op != 2))
                    m += utf8_encode(cps[i], changed + m);
            }
            compare_text(t, g, changed, m, gtext, st);
        }
    }
    grammar_cursor_free(c);
    grammar_cursor_free(probe);
}

static void random_grammars_match_their_trees(void)
{
    static tree t;
    uint64_t rng = 0x6772616d6d617273u;
    test_random_seed(&rng);
    t.rng = &rng;
    char text[8192];
    oracle_stats st = {0};
#ifdef TEST_SANITIZED
    const int rounds = 150;
#else
    const int rounds = 600;
#endif
    for (int round = 0; round < rounds; round++) {
        if (!gen_tree(&t, text, sizeof text))
            continue;
        char err[ERR_MAX];
        grammar *g = NULL;
        if (grammar_compile(text, strlen(text), &g, err)) {
            /* random rules may begin with themselves or never finish; nothing else */
            CHECK_MSG(strstr(err, "left recursion") || strstr(err, "never finishes") ||
                      strstr(err, "its start needs"), "%s\n%s", err, text);
            st.refused++;
            continue;
        }
        st.grammars++;
        random_texts(&t, g, text, &rng, &st);
        grammar_free(g);
    }
    fprintf(stderr, "       %d grammars (%d refused), %d texts, %d walks, %d sentences, "
            "%d bounded\n", st.grammars, st.refused, st.texts, st.walks, st.sentences, st.bounded);
    CHECK_MSG(st.grammars > rounds / 3 && st.sentences > rounds / 2, "%d grammars, %d sentences",
              st.grammars, st.sentences);
}

/* Random walks on llama.cpp's grammars: never a dead end, and whatever the walk wrote is
 * taken again whole, in one feed. */
static void random_walks_never_dead_end(void)
{
    static const char *const files[] = {"json.gbnf", "json_arr.gbnf", "list.gbnf",
                                        "arithmetic.gbnf", "c.gbnf", "chess.gbnf",
                                        "english.gbnf", "japanese.gbnf"};
    uint64_t rng = 0x77616c6b73u;
    test_random_seed(&rng);
    int files_completed = 0;
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
        grammar *g = compile_file(files[f]);
        CHECK(g);
        grammar_cursor *c = cursor_of(g), *probe = cursor_of(g), *again = cursor_of(g);
        CHECK(c && probe && again);
        int complete = 0;
        for (int w = 0; w < 20; w++) {
            grammar_cursor_reset(c);
            char text[400];
            size_t n = 0;
            bool ok[256];
            for (;;) {
                next_bytes(c, probe, ok);
                int n_ok = 0;
                for (int b = 0; b < 256; b++)
                    n_ok += ok[b];
                CHECK_MSG(n_ok > 0 || grammar_complete(c), "%s: a dead end after '%.*s'",
                          files[f], (int)n, text);
                CHECK_EQ(grammar_finished(c), n_ok == 0 && grammar_complete(c));
                if (n_ok == 0 || n == sizeof text ||
                    (grammar_complete(c) && test_random(&rng) % 8 == 0))
                    break;
                /* prefer ASCII, so that walks reach the structure's ends */
                int pick, b = 0;
                do
                    pick = (int)(test_random(&rng) % 256);
                while (!ok[pick] && ++b < 512);
                if (!ok[pick])
                    for (pick = 0; !ok[pick]; pick++)
                        ;
                uint8_t byte = (uint8_t)pick;
                CHECK_EQ(grammar_feed(c, &byte, 1), 0);
                text[n++] = (char)byte;
            }
            grammar_cursor_reset(again);
            CHECK_EQ(grammar_feed(again, text, n), 0);
            CHECK_EQ(grammar_complete(again), grammar_complete(c));
            CHECK(utf8_valid(text, n) || !grammar_complete(c));
            complete += grammar_complete(c);
        }
        files_completed += complete > 0;
        grammar_cursor_free(c);
        grammar_cursor_free(probe);
        grammar_cursor_free(again);
        grammar_free(g);
    }
    /* a random walk seldom closes a C function; the others' sentences end often */
    CHECK_MSG(files_completed >= 6, "walks completed in %d grammars", files_completed);
}

/* ---- tokens ---- */

typedef struct loaded_vocab {
    gguf_file *g;
    tokenizer *tok;
    grammar_vocab *v;
} loaded_vocab;

static void vocab_close(loaded_vocab *lv)
{
    grammar_vocab_free(lv->v);
    tok_free(lv->tok);
    gguf_close(lv->g);
}

/* The tokenizer of a test data file and its table; false (after a skip or a failure
 * message) when it cannot be had. */
static bool vocab_open(const char *rel, loaded_vocab *lv)
{
    char err[ERR_MAX];
    memset(lv, 0, sizeof *lv);
    const char *path = test_data_path(rel);
    if (!path) {
        test_skip("%s is not in the test data", rel);
        return false;
    }
    if (!(lv->g = gguf_open(path, err)) || tok_load(lv->g, &lv->tok, err) ||
        grammar_vocab_new(lv->tok, &lv->v, err)) {
        test_fail(__FILE__, __LINE__, "%s: %s", rel, err);
        vocab_close(lv);
        return false;
    }
    return true;
}

/* Whether feeding token's piece to a copy of c's state takes every byte (probe: scratch). */
static bool allowed_by_piece(const tokenizer *tok, const grammar_cursor *c,
                             grammar_cursor *probe, int32_t id)
{
    if (tok_is_eog(tok, id))
        return grammar_complete(c);
    enum tok_type type = tok_type(tok, id);
    if (type == TOK_TYPE_CONTROL || type == TOK_TYPE_UNKNOWN || type == TOK_TYPE_UNUSED)
        return false;
    char piece[1024];
    int n = tok_piece(tok, id, piece, sizeof piece);
    if (n <= 0 || n >= (int)sizeof piece)
        return false;
    grammar_cursor_copy(probe, c);
    return grammar_feed(probe, piece, (size_t)n) == 0;
}

/* Takes the tokens of text one by one (at most max_steps); before each, every token's
 * verdict must be what feeding its piece says, and a refused take leaves the cursor as it
 * was. */
static void verdicts_match_pieces(const char *rel, loaded_vocab *lv, const grammar *g,
                                  const char *text, int max_steps)
{
    int32_t ids[1024];
    int n = tok_encode(lv->tok, text, strlen(text), false, false, ids, 1024);
    CHECK(n > 0 && n <= 1024);
    char err[ERR_MAX];
    grammar_cursor *c = NULL, *probe = NULL;
    CHECK_MSG(grammar_cursor_new(g, lv->v, &c, err) == 0 &&
              grammar_cursor_new(g, lv->v, &probe, err) == 0, "%s", err);
    int32_t n_vocab = tok_n_vocab(lv->tok);
    long allowed = 0;
    for (int i = 0; i <= n && i < max_steps; i++) {
        int32_t refused_tok = -1;
        for (int32_t id = 0; id < n_vocab; id++) {
            bool want = allowed_by_piece(lv->tok, c, probe, id);
            CHECK_MSG(grammar_allows(c, id) == want, "%s: token %d after %d tokens: %d, its "
                      "piece says %d", rel, id, i, !want, want);
            allowed += want;
            if (!want && !tok_is_eog(lv->tok, id))
                refused_tok = id;
        }
        if (refused_tok >= 0) {
            /* a refused take changes nothing: the same verdict for the document's token */
            bool before = i < n && grammar_allows(c, ids[i]);
            CHECK_EQ(grammar_take(c, refused_tok), -1);
            CHECK(i >= n || grammar_allows(c, ids[i]) == before);
        }
        if (i < n)
            CHECK_MSG(grammar_take(c, ids[i]) == 0, "%s: token %d of the text refused", rel, i);
    }
    CHECK(!grammar_allows(c, -1) && !grammar_allows(c, n_vocab));
    CHECK(allowed > 0);
    grammar_cursor_free(c);
    grammar_cursor_free(probe);
}

/* A grammar of tests/engine/data whose root rule (the line root_line) also takes the
 * space SentencePiece puts before the first word. */
static grammar *with_leading_space(const char *file, const char *root_line)
{
    char *text = read_data(file);
    if (!text)
        return NULL;
    char *root = strstr(text, root_line), *spaced = malloc(strlen(text) + 64);
    grammar *g = NULL;
    if (!root || !spaced) {
        test_fail(__FILE__, __LINE__, "%s has no line '%s'", file, root_line);
    } else {
        const char *body = root + strcspn(root, ":") + 3;
        snprintf(spaced, strlen(text) + 64, "%.*sroot ::= \" \"? %s", (int)(root - text), text,
                 body);
        g = compile_text(spaced, file);
    }
    free(spaced);
    free(text);
    return g;
}

static void tokens_match_pieces(const char *rel)
{
    loaded_vocab lv;
    if (!vocab_open(rel, &lv))
        return;
#ifdef TEST_SANITIZED
    const int steps = 12;
#else
    const int steps = 60;
#endif
    grammar *json = with_leading_space("json.gbnf", "root   ::= object");
    CHECK(json);
    verdicts_match_pieces(rel, &lv, json,
                          "{\"name\": \"caf\xc3\xa9 \\u00e9 \xe2\x82\xac\", \"n\": [1, -2.5e3, "
                          "true, null], \"o\": {\"k\": \"v\"}, \"tail\": \"x y z\"}",
                          steps);
    grammar_free(json);
    grammar *jp = with_leading_space("japanese.gbnf", "root        ::= jp-char+");
    CHECK(jp);
    verdicts_match_pieces(rel, &lv, jp,
                          "\xe3\x81\x93\xe3\x82\x93\xe3\x81\xab\xe3\x81\xa1\xe3\x81\xaf "
                          "\xe4\xb8\x96\xe7\x95\x8c", steps / 2);
    grammar_free(jp);
    vocab_close(&lv);
}

static void tokens_docs_vocab(void)
{
    tokens_match_pieces("models/docs-lm-21M-F16.gguf");
}

static void tokens_llama_vocab(void)
{
    tokens_match_pieces("vocab/ggml-vocab-llama-spm.gguf");
}

static void tokens_gpt2_vocab(void)
{
    tokens_match_pieces("vocab/ggml-vocab-gpt-2.gguf");
}

/* End-of-generation tokens only once the text is complete; control tokens never. */
static void end_of_generation(void)
{
    loaded_vocab lv;
    if (!vocab_open("models/docs-lm-21M-F16.gguf", &lv))
        return;
    grammar *g = compile_text("root ::= \"{\" \"}\"?", "braces");
    CHECK(g);
    char err[ERR_MAX];
    grammar_cursor *c = NULL;
    CHECK_MSG(grammar_cursor_new(g, lv.v, &c, err) == 0, "%s", err);
    int32_t open = tok_find(lv.tok, "<0x7B>", 6), close = tok_find(lv.tok, "<0x7D>", 6);
    int32_t eos = tok_eos(lv.tok), bos = tok_bos(lv.tok);
    CHECK(open >= 0 && close >= 0 && eos >= 0 && bos >= 0);
    CHECK(grammar_allows(c, open) && !grammar_allows(c, close));
    CHECK(!grammar_allows(c, eos) && !grammar_allows(c, bos));
    CHECK_EQ(grammar_take(c, eos), -1);
    CHECK_EQ(grammar_take(c, open), 0);
    CHECK(grammar_complete(c) && !grammar_finished(c));
    CHECK(grammar_allows(c, eos) && !grammar_allows(c, bos) && grammar_allows(c, close));
    CHECK_EQ(grammar_take(c, close), 0);
    CHECK(grammar_finished(c));
    CHECK(grammar_allows(c, eos) && !grammar_allows(c, open));
    CHECK_EQ(grammar_take(c, eos), 0);
    CHECK(grammar_finished(c));
    grammar_cursor_free(c);
    grammar_free(g);
    vocab_close(&lv);
}

int main(void)
{
    RUN(compile_errors);
    RUN(compile_limits);
    RUN(syntax_accepted);
    RUN(json_grammar);
    RUN(other_grammars);
    RUN(repetition_counts);
    RUN(utf8_characters);
    RUN(classes);
    RUN(cursor_state);
    RUN(bounds);
    RUN(thousand_words);
    RUN(random_grammars_match_their_trees);
    RUN(random_walks_never_dead_end);
    RUN(tokens_docs_vocab);
    RUN(tokens_llama_vocab);
    RUN(tokens_gpt2_vocab);
    RUN(end_of_generation);
    return test_finish();
}
