/*
 * Tests of the gpt-oss reply reader (daemon/net/harmony.h): replies told apart into
 * reasoning and content (calls in chatml's syntax) whole, and fed cut at every place
 * into two pieces, byte by byte and in three pieces, which must all give the same texts;
 * nothing held back but what may be markup. Then reasoning.h's harmony split, whole and
 * streamed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/net/harmony.h"
#include "daemon/net/reasoning.h"
#include "tests/support/test.h"

#define CALL(name, args) "<tool_call>\n{\"name\": \"" name "\", \"arguments\": " args "}\n</tool_call>"

static const struct {
    const char *reply, *reasoning, *content;
} CASES[] = {
    /* as gpt-oss writes it after "<|start|>assistant" (its <|return|> ends generation
     * and is not in the text, but a reply may hold it) */
    {"<|channel|>analysis<|message|>User asks 2+2.<|end|><|start|>assistant<|channel|>final"
     "<|message|>4",
     "User asks 2+2.", "4"},
    {"<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>4"
     "<|return|>",
     "x", "4"},
    {"<|channel|>final<|message|>Hello.", "", "Hello."},
    /* a call, its recipient after the channel or before it */
    {"<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
     "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
     "Need weather.", CALL("get_weather", "{\"city\":\"Paris\"}")},
    {"<|channel|>analysis<|message|>a<|end|><|start|>assistant to=functions.get_weather"
     "<|channel|>commentary json<|message|>{\"city\": \"Rome\"}",
     "a", CALL("get_weather", "{\"city\": \"Rome\"}")},
    {" to=functions.f<|channel|>commentary<|message|>{}", "", CALL("f", "{}")},
    /* a preamble on commentary is content; two calls one after the other */
    {"<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary "
     "to=functions.a <|constrain|>json<|message|>{}<|call|><|start|>assistant<|channel|>"
     "commentary to=functions.b<|message|>{\"x\":1}<|end|>",
     "", "Checking." CALL("a", "{}") CALL("b", "{\"x\":1}")},
    /* a recipient that is no function of ours, or a bad name: content */
    {"<|channel|>commentary to=browser.search<|message|>q", "", "q"},
    {"<|channel|>commentary to=functions.a\"b<|message|>{}", "", "{}"},
    /* what only looks like an end marker stays text */
    {"<|channel|>analysis<|message|>a <|en < <|end|<|returned|> <<|end|><|start|>assistant"
     "<|channel|>final<|message|>b <| c",
     "a <|en < <|end|<|returned|> <", "b <| c"},
    /* unclosed: the kind to the end, an ender cut short included */
    {"<|channel|>analysis<|message|>still thinking <|ret", "still thinking <|ret", ""},
    {"<|channel|>analysis<|message|>", "", ""},
    /* a header never finished is markup */
    {"<|channel|>analysis<|message|>a<|end|><|start|>assistant<|chan", "a", ""},
    {"<|channel|>analy", "", ""},
    {"", "", ""},
    /* not the format: content as it is */
    {"Hello <|channel|>", "", "Hello <|channel|>"},
    {"<|foo|>bar", "", "<|foo|>bar"},
    {"\xc3\xa9t\xc3\xa9", "", "\xc3\xa9t\xc3\xa9"},
    {"<|channel|>final<|message|>\xe2\x9c\x93<|end|>", "", "\xe2\x9c\x93"},
};
#define N_CASES (sizeof CASES / sizeof CASES[0])

#define CHECK_STR(a, b) CHECK_MSG(strcmp((a), (b)) == 0, "'%s' != '%s'", (a), (b))

/* What a feed gives, added up; bad: an empty run, a failed feed, or more than fits. */
typedef struct got {
    char reasoning[512], content[512];
    size_t nr, nc;
    bool bad;
} got;

static int add(void *arg, bool reasoning, const char *text, size_t n)
{
    got *g = arg;
    char *to = reasoning ? g->reasoning : g->content;
    size_t *at = reasoning ? &g->nr : &g->nc;
    g->bad |= n == 0 || *at + n >= sizeof g->reasoning;
    if (n > 0 && *at + n < sizeof g->reasoning) {
        memcpy(to + *at, text, n);
        *at += n;
        to[*at] = '\0';
    }
    return 0;
}

/* The reply fed in pieces ending at cuts[0..n_cuts) (and at its end). */
static got feed_cut(const char *reply, const size_t *cuts, int n_cuts)
{
    harmony_split s;
    got g = {0};
    size_t len = strlen(reply), from = 0;
    harmony_init(&s, true);
    for (int i = 0; i <= n_cuts; i++) {
        size_t to = i < n_cuts ? cuts[i] : len;
        g.bad |= harmony_feed(&s, reply + from, to - from, i == n_cuts, add, &g) != 0;
        from = to;
    }
    g.bad |= s.fed != len;
    return g;
}

static void check_got(const got *g, size_t c, const char *how)
{
    CHECK_MSG(!g->bad, "case %zu %s: a bad feed", c, how);
    CHECK_MSG(strcmp(g->reasoning, CASES[c].reasoning) == 0, "case %zu %s: reasoning '%s'", c,
              how, g->reasoning);
    CHECK_MSG(strcmp(g->content, CASES[c].content) == 0, "case %zu %s: content '%s'", c, how,
              g->content);
}

static void whole_replies(void)
{
    for (size_t c = 0; c < N_CASES; c++) {
        got g = feed_cut(CASES[c].reply, NULL, 0);
        check_got(&g, c, "whole");
    }
}

static void every_cut_gives_the_same(void)
{
    for (size_t c = 0; c < N_CASES; c++) {
        size_t len = strlen(CASES[c].reply);
        for (size_t a = 0; a <= len; a++) {
            size_t one[] = {a};
            got g = feed_cut(CASES[c].reply, one, 1);
            check_got(&g, c, "in two");
            for (size_t b = a; b <= len && len < 120; b += 3) {
                size_t two[] = {a, b};
                g = feed_cut(CASES[c].reply, two, 2);
                check_got(&g, c, "in three");
            }
        }
    }
}

static void byte_by_byte(void)
{
    for (size_t c = 0; c < N_CASES; c++) {
        size_t len = strlen(CASES[c].reply), cuts[512];
        for (size_t i = 0; i < len; i++)
            cuts[i] = i + 1;
        got g = feed_cut(CASES[c].reply, cuts, (int)len);
        check_got(&g, c, "byte by byte");
    }
}

/* A body goes out as it comes but for what may be an ender; the header never. */
static void holds_back_only_what_may_be_markup(void)
{
    harmony_split s;
    got g = {0};
    harmony_init(&s, true);
    harmony_feed(&s, "<|channel|>analysis<|message|>", 30, false, add, &g);
    CHECK_EQ(g.nr + g.nc, 0u);
    harmony_feed(&s, "Think <|e", 9, false, add, &g);
    CHECK_STR(g.reasoning, "Think ");
    harmony_feed(&s, "x", 1, false, add, &g);
    CHECK_STR(g.reasoning, "Think <|ex");
    harmony_feed(&s, "<|end|><|start|>assistant<|channel|>final<|message|>A", 53, false, add, &g);
    CHECK_STR(g.content, "A");
    /* a call's opening goes out with its header, its arguments as they come */
    harmony_init(&s, true);
    g = (got){0};
    harmony_feed(&s, "<|channel|>commentary to=functions.f json<|message|>{\"a\"", 56, false,
                 add, &g);
    CHECK_STR(g.content, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\"");
    harmony_feed(&s, "", 0, true, add, &g);
    CHECK_STR(g.content, CALL("f", "{\"a\"") );
    /* a header longer than any is not one: raw content from there */
    harmony_init(&s, true);
    g = (got){0};
    char long_header[HARMONY_HEADER_MAX + 20];
    memset(long_header, 'x', sizeof long_header);
    memcpy(long_header, "<|channel|>", 11);
    harmony_feed(&s, long_header, sizeof long_header, true, add, &g);
    CHECK_EQ(g.nc, sizeof long_header);
}

/* reasoning.h's split of a gpt-oss reply, streamed and whole. */
static void reasoning_split_of_harmony(void)
{
    static const char reply[] = "<|channel|>analysis<|message|>r<|end|><|start|>assistant"
                                "<|channel|>final<|message|>c";
    reasoning_split s;
    got g = {0};
    reasoning_start(&s, CHAT_THINK_HARMONY, true);
    CHECK_EQ(reasoning_feed_each(&s, reply, 40, false, add, &g), 0);
    CHECK_EQ(reasoning_feed_each(&s, reply + 40, sizeof reply - 41, true, add, &g), 0);
    CHECK_STR(g.reasoning, "r");
    CHECK_STR(g.content, "c");
    CHECK_EQ(reasoning_fed(&s), sizeof reply - 1);
    /* the think markers' split through the same call */
    reasoning_start(&s, CHAT_THINK_REPLY, false);
    g = (got){0};
    CHECK_EQ(reasoning_feed_each(&s, "<think>a</think>b", 17, true, add, &g), 0);
    CHECK_STR(g.reasoning, "a");
    CHECK_STR(g.content, "b");
    char *owned = NULL;
    reasoning_span r, c;
    CHECK_EQ(reasoning_split_harmony(reply, sizeof reply - 1, true, &owned, &r, &c), 0);
    CHECK(r.n == 1 && r.text[0] == 'r' && c.n == 1 && c.text[0] == 'c');
    free(owned);
    static const char call[] = "<|channel|>analysis<|message|>think<|end|><|start|>assistant"
                               " to=functions.get_weather<|channel|>commentary json<|message|>"
                               "{\"city\":\"Paris\"}";
    CHECK_EQ(reasoning_split_harmony(call, sizeof call - 1, true, &owned, &r, &c), 0);
    CHECK(r.n == 5 && memcmp(r.text, "think", 5) == 0);
    CHECK_STR(c.text, CALL("get_weather", "{\"city\":\"Paris\"}"));
    free(owned);
    /* calls not read (no tools, tool_choice "none"): the call's body is content */
    CHECK_EQ(reasoning_split_harmony(call, sizeof call - 1, false, &owned, &r, &c), 0);
    CHECK(r.n == 5 && memcmp(r.text, "think", 5) == 0);
    CHECK_STR(c.text, "{\"city\":\"Paris\"}");
    free(owned);
}

int main(void)
{
    RUN(whole_replies);
    RUN(every_cut_gives_the_same);
    RUN(byte_by_byte);
    RUN(holds_back_only_what_may_be_markup);
    RUN(reasoning_split_of_harmony);
    return test_finish();
}
