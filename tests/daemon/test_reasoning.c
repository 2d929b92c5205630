/*
 * Tests of the reasoning splitter (daemon/net/reasoning.h): replies told apart into
 * reasoning and content whole, and fed in pieces cut at every place (every split point
 * of both markers among them), byte by byte and in three pieces, which must give the same
 * texts; nothing held back but what may begin a marker.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/net/reasoning.h"
#include "tests/support/test.h"

static const struct {
    enum chat_think kind; /* the family's: where a block may open */
    const char *reply, *reasoning, *content;
} CASES[] = {
    /* as Qwen3 and the R1 distills write it */
    {CHAT_THINK_REPLY, "<think>\nI add them.\n</think>\n\nThe answer is 4.", "I add them.",
     "The answer is 4."},
    {CHAT_THINK_REPLY, "<think>I add them.</think>The answer is 4.", "I add them.",
     "The answer is 4."},
    /* no block: all content, as it is */
    {CHAT_THINK_REPLY, "The answer is 4.", "", "The answer is 4."},
    {CHAT_THINK_REPLY, "", "", ""},
    {CHAT_THINK_REPLY, " <think>x</think>y", "", " <think>x</think>y"},
    {CHAT_THINK_REPLY, "Text <think>x</think> y", "", "Text <think>x</think> y"},
    {CHAT_THINK_REPLY, "<<think>x</think>y", "", "<<think>x</think>y"},
    {CHAT_THINK_REPLY, "<thinking>x</thinking>y", "", "<thinking>x</thinking>y"},
    /* a reply cut inside the opening marker is what it wrote */
    {CHAT_THINK_REPLY, "<thi", "", "<thi"},
    /* unclosed: reasoning to the end, a marker cut short included */
    {CHAT_THINK_REPLY, "<think>\nStill thinking", "Still thinking", ""},
    {CHAT_THINK_REPLY, "<think>\nStill thinking\n</thi", "Still thinking\n</thi", ""},
    {CHAT_THINK_REPLY, "<think>", "", ""},
    {CHAT_THINK_REPLY, "<think>\n\n", "", ""},
    /* an empty block (Qwen3's enable_thinking false, written by the model) */
    {CHAT_THINK_REPLY, "<think>\n\n</think>\n\nHello.", "", "Hello."},
    {CHAT_THINK_REPLY, "<think></think>", "", ""},
    /* one line break before the close goes with it, more stay */
    {CHAT_THINK_REPLY, "<think>a\n\n</think>b", "a\n", "b"},
    {CHAT_THINK_REPLY, "<think>a \n</think>b", "a ", "b"},
    /* what only looks like a marker stays text */
    {CHAT_THINK_REPLY, "<think>a <</ /think> </thin </think\n>\n</think>\n  b",
     "a <</ /think> </thin </think\n>", "b"},
    {CHAT_THINK_REPLY, "<think>a<think>b</think>c", "a<think>b", "c"},
    /* after the block everything is content, a second block too */
    {CHAT_THINK_REPLY, "<think>a</think>b</think>c<think>d</think>", "a",
     "b</think>c<think>d</think>"},
    {CHAT_THINK_REPLY, "<think>\xc3\xa9t\xc3\xa9\n</think>\n\xe2\x9c\x93", "\xc3\xa9t\xc3\xa9",
     "\xe2\x9c\x93"},
    /* the template opened the block: the reply begins inside it */
    {CHAT_THINK_OPENED, "\nI add them.\n</think>\n\nThe answer is 4.", "I add them.",
     "The answer is 4."},
    {CHAT_THINK_OPENED, "All of it is reasoning", "All of it is reasoning", ""},
    {CHAT_THINK_OPENED, "</think>Answer", "", "Answer"},
    {CHAT_THINK_OPENED, "<think>x</think>y", "<think>x", "y"},
    {CHAT_THINK_OPENED, "", "", ""},
    /* GLM-4.5 and 4.6 write a line break before the block, and before an answer the
     * generation prompt's closed block ("<think></think>") leaves */
    {CHAT_THINK_REPLY_SPACED, "\n<think>I add them.</think>\nThe answer is 4.", "I add them.",
     "The answer is 4."},
    {CHAT_THINK_REPLY_SPACED, "<think>\nx\n</think>\n\ny", "x", "y"},
    {CHAT_THINK_REPLY_SPACED, " \n\t<think>x", "x", ""},
    {CHAT_THINK_REPLY_SPACED, "\nThe answer is 4.", "", "The answer is 4."},
    {CHAT_THINK_REPLY_SPACED, "\nText <think>x</think> y", "", "Text <think>x</think> y"},
    {CHAT_THINK_REPLY_SPACED, "\n<thi", "", "<thi"},
    {CHAT_THINK_REPLY_SPACED, "\n <<think>x</think>", "", "<<think>x</think>"},
    {CHAT_THINK_REPLY_SPACED, "\n\n", "", ""},
    {CHAT_THINK_REPLY_SPACED, "", "", ""},
    {CHAT_THINK_REPLY_SPACED, "\n<think></think>\n</think>", "", "</think>"},
};
#define N_CASES (sizeof CASES / sizeof CASES[0])

/* What a split gives, added up. */
typedef struct got {
    char reasoning[256], content[256];
    size_t nr, nc;
    bool ok;
} got;

static void take(got *g, const reasoning_span *sp, int k)
{
    for (int i = 0; i < k; i++) {
        char *to = sp[i].reasoning ? g->reasoning : g->content;
        size_t *len = sp[i].reasoning ? &g->nr : &g->nc;
        if (sp[i].n == 0 || *len + sp[i].n >= sizeof g->reasoning) {
            g->ok = false;
            continue;
        }
        memcpy(to + *len, sp[i].text, sp[i].n);
        *len += sp[i].n;
        to[*len] = '\0';
    }
}

/* The reply fed in pieces ending at cuts[0..n_cuts) and then its end. */
static got feed_cut(size_t c, const size_t *cuts, size_t n_cuts)
{
    got g = {.ok = true};
    reasoning_split s;
    reasoning_span sp[REASONING_SPANS];
    reasoning_start(&s, CASES[c].kind, false);
    const char *t = CASES[c].reply;
    size_t len = strlen(t), at = 0;
    for (size_t i = 0; i <= n_cuts; i++) {
        size_t to = i < n_cuts ? cuts[i] : len;
        take(&g, sp, reasoning_feed(&s, t + at, to - at, i == n_cuts, sp));
        g.ok &= s.n_held <= REASONING_HOLD_MAX && reasoning_fed(&s) == to;
        at = to;
    }
    return g;
}

static bool same(const got *g, size_t c)
{
    return g->ok && !strcmp(g->reasoning, CASES[c].reasoning) &&
           !strcmp(g->content, CASES[c].content);
}

static void whole_replies(void)
{
    for (size_t c = 0; c < N_CASES; c++) {
        got g = feed_cut(c, NULL, 0);
        CHECK_MSG(same(&g, c), "%zu: reasoning '%s' content '%s'", c, g.reasoning, g.content);
        reasoning_span r, t;
        reasoning_split_text(CASES[c].kind, CASES[c].reply, strlen(CASES[c].reply), &r, &t);
        CHECK_MSG(r.n == strlen(CASES[c].reasoning) && !memcmp(r.text, CASES[c].reasoning, r.n) &&
                      t.n == strlen(CASES[c].content) && !memcmp(t.text, CASES[c].content, t.n),
                  "%zu: split_text '%.*s' '%.*s'", c, (int)r.n, r.text, (int)t.n, t.text);
        /* the runs lie in the reply itself */
        CHECK(r.n == 0 || (r.text >= CASES[c].reply && r.text + r.n <= CASES[c].reply +
                                                                         strlen(CASES[c].reply)));
    }
}

/* Every place a reply may be cut into two pieces (an empty one at either end too), and
 * into three. */
static void every_cut_gives_the_same(void)
{
    for (size_t c = 0; c < N_CASES; c++) {
        size_t len = strlen(CASES[c].reply);
        for (size_t i = 0; i <= len; i++) {
            got g = feed_cut(c, &i, 1);
            CHECK_MSG(same(&g, c), "%zu cut at %zu: reasoning '%s' content '%s'", c, i,
                      g.reasoning, g.content);
            for (size_t j = i; j <= len; j++) {
                size_t cuts[2] = {i, j};
                g = feed_cut(c, cuts, 2);
                CHECK_MSG(same(&g, c), "%zu cut at %zu, %zu: reasoning '%s' content '%s'", c, i,
                          j, g.reasoning, g.content);
            }
        }
    }
}

static void byte_by_byte(void)
{
    for (size_t c = 0; c < N_CASES; c++) {
        size_t len = strlen(CASES[c].reply), cuts[256];
        for (size_t i = 0; i < len; i++)
            cuts[i] = i + 1;
        got g = feed_cut(c, cuts, len);
        CHECK_MSG(same(&g, c), "%zu byte by byte: reasoning '%s' content '%s'", c, g.reasoning,
                  g.content);
    }
}

/* Text goes out as soon as it cannot begin a marker: a streamed reply is not delayed. */
static void holds_back_only_what_may_be_a_marker(void)
{
    reasoning_split s;
    reasoning_span sp[REASONING_SPANS];
    reasoning_init(&s, false);
    CHECK_EQ(reasoning_feed(&s, "<thi", 4, false, sp), 0);
    CHECK_EQ(s.n_held, 4u);
    int k = reasoning_feed(&s, "nk>\nOne", 7, false, sp);
    CHECK(k == 1 && sp[0].reasoning && sp[0].n == 3 && !memcmp(sp[0].text, "One", 3));
    /* a line break may begin the close: held; the next letter lets it out */
    CHECK_EQ(reasoning_feed(&s, "\n", 1, false, sp), 0);
    k = reasoning_feed(&s, "two", 3, false, sp);
    CHECK(k == 2 && sp[0].n == 1 && sp[0].text[0] == '\n' && sp[1].n == 3 && sp[0].reasoning &&
          sp[1].reasoning);
    /* the longest a split holds: the line break and the close less its last byte */
    CHECK_EQ(reasoning_feed(&s, "\n</think", 8, false, sp), 0);
    CHECK_EQ(s.n_held, (size_t)REASONING_HOLD_MAX);
    k = reasoning_feed(&s, "!", 1, false, sp);
    CHECK(k == 2 && sp[0].n == 8 && sp[1].n == 1 && sp[1].reasoning);
    k = reasoning_feed(&s, "</think>\n\nDone", 14, false, sp);
    CHECK(k == 1 && !sp[0].reasoning && sp[0].n == 4 && !memcmp(sp[0].text, "Done", 4));
    /* content is never held */
    k = reasoning_feed(&s, "<", 1, false, sp);
    CHECK(k == 1 && !sp[0].reasoning && sp[0].n == 1);
    CHECK_EQ(reasoning_fed(&s), 39u);
    /* a reply that is not a block goes out at its first byte that cannot open one */
    reasoning_init(&s, false);
    k = reasoning_feed(&s, "<a", 2, false, sp);
    CHECK(k == 1 && !sp[0].reasoning && sp[0].n == 2);
    /* white space before a block that may open is dropped, not held: a long run of it
     * costs nothing */
    reasoning_start(&s, CHAT_THINK_REPLY_SPACED, false);
    CHECK_EQ(reasoning_feed(&s, "\n\n\n\n\n\n\n\n\n\n", 10, false, sp), 0);
    CHECK_EQ(s.n_held, 0u);
    CHECK_EQ(reasoning_feed(&s, " <thin", 6, false, sp), 0);
    CHECK_EQ(s.n_held, 5u);
    k = reasoning_feed(&s, "k>a", 3, false, sp);
    CHECK(k == 1 && sp[0].reasoning && sp[0].n == 1 && sp[0].text[0] == 'a');
    reasoning_start(&s, CHAT_THINK_REPLY_SPACED, false);
    k = reasoning_feed(&s, "\nHi", 3, false, sp);
    CHECK(k == 1 && !sp[0].reasoning && sp[0].n == 2 && !memcmp(sp[0].text, "Hi", 2));
}

int main(void)
{
    RUN(whole_replies);
    RUN(every_cut_gives_the_same);
    RUN(byte_by_byte);
    RUN(holds_back_only_what_may_be_a_marker);
    return test_finish();
}
