/*
 * jsonmask: the byte-level JSON recogniser (valid and invalid prefixes, strings and their
 * escapes, numbers, literals, the depth and whitespace bounds, UTF-8, completion), a
 * property test against json-c on random and mutated documents, and the token table of
 * real vocabularies (SentencePiece, byte fallback, byte-level BPE) against feeding each
 * token's bytes one by one.
 */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/jsonmask.h"
#include "engine/model/jsonschema.h"
#include "engine/model/model.h"
#include "engine/model/sampler.h"
#include "tests/support/test.h"

/* Feeds s whole: 1 complete, 0 a valid prefix, -1 refused. */
static int feed_str(const char *s, size_t n)
{
    jsonmask_state st;
    jsonmask_init(&st);
    if (!jsonmask_feed(&st, s, n))
        return -1;
    return jsonmask_complete(&st) ? 1 : 0;
}

#define FEED(lit) feed_str(lit, sizeof(lit) - 1)

/* The byte at which s is first refused (feeding one byte at a time), or -1. */
static long refused_at(const char *s, size_t n)
{
    jsonmask_state st;
    jsonmask_init(&st);
    for (size_t i = 0; i < n; i++)
        if (!jsonmask_feed(&st, s + i, 1))
            return (long)i;
    return -1;
}

#define REFUSED_AT(lit) refused_at(lit, sizeof(lit) - 1)

static void whole_documents_are_complete(void)
{
    static const char *const docs[] = {
        "{}", "{ }", " \n\t\r{}", "{\"a\":1}", "{\"a\" : [ ] , \"b\":{}}",
        "{\"a\":{\"b\":[true,false,null]}}", "{\"\":null}", "{\"a\":1,\"a\":2}",
        "{\"a\":-0}", "{\"a\":-0.5E+3}", "{\"a\":1e5}", "{\"a\":1E-05}", "{\"a\":0.000}",
        "{\"a\":[1 ,2, -3.25e2]}", "{\"a\":\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\uD83D\\uDE00\"}",
        "{\"k\\u0041y\":\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"}", "{\"a\":\"\x7f\"}",
        "{\"a\":123456789012345678901234567890}", "{\"a\":[[],[{}],[[[\"x\"]]]]}",
    };
    for (size_t i = 0; i < sizeof docs / sizeof *docs; i++) {
        size_t n = strlen(docs[i]);
        CHECK_MSG(feed_str(docs[i], n) == 1, "'%s' is not accepted whole", docs[i]);
        /* every proper prefix is valid and not complete */
        for (size_t k = 0; k < n; k++)
            CHECK_MSG(feed_str(docs[i], k) == 0, "'%.*s' (a prefix of '%s') is not a plain "
                      "prefix", (int)k, docs[i], docs[i]);
    }
}

static void nothing_follows_the_object(void)
{
    CHECK_EQ(REFUSED_AT("{} "), 2);
    CHECK_EQ(REFUSED_AT("{}{}"), 2);
    CHECK_EQ(REFUSED_AT("{}\n"), 2);
    CHECK_EQ(REFUSED_AT("{\"a\":1}x"), 7);
}

static void top_level_must_be_an_object(void)
{
    CHECK_EQ(REFUSED_AT("[1]"), 0);
    CHECK_EQ(REFUSED_AT("\"a\""), 0);
    CHECK_EQ(REFUSED_AT("1"), 0);
    CHECK_EQ(REFUSED_AT("true"), 0);
    CHECK_EQ(REFUSED_AT("  null"), 2);
    CHECK_EQ(REFUSED_AT("\xef\xbb\xbf{}"), 0); /* no byte order mark */
}

static void structure_errors(void)
{
    CHECK_EQ(REFUSED_AT("{,}"), 1);
    CHECK_EQ(REFUSED_AT("{\"a\"}"), 4);
    CHECK_EQ(REFUSED_AT("{\"a\"::1}"), 5);
    CHECK_EQ(REFUSED_AT("{\"a\":1,}"), 7);
    CHECK_EQ(REFUSED_AT("{\"a\":[1,]}"), 8);
    CHECK_EQ(REFUSED_AT("{\"a\":[]]}"), 7);
    CHECK_EQ(REFUSED_AT("{\"a\":{]}"), 6);
    CHECK_EQ(REFUSED_AT("{\"a\":1 2}"), 7);
    CHECK_EQ(REFUSED_AT("{\"a\":\"x\" \"y\"}"), 9);
    CHECK_EQ(REFUSED_AT("{'a':1}"), 1);
    CHECK_EQ(REFUSED_AT("{a:1}"), 1);
    CHECK_EQ(REFUSED_AT("{1:1}"), 1);
    CHECK_EQ(REFUSED_AT("{\"a\":1]"), 6);
    CHECK_EQ(REFUSED_AT("{\"a\":[1}"), 7);
    CHECK_EQ(REFUSED_AT("{\"a\":}"), 5);
    CHECK_EQ(REFUSED_AT("{\"a\"\v:1}"), 4);
    CHECK_EQ(REFUSED_AT("{\"a\":\f1}"), 5);
}

static void literals(void)
{
    CHECK_EQ(FEED("{\"a\":true}"), 1);
    CHECK_EQ(FEED("{\"a\":[false,null]}"), 1);
    CHECK_EQ(REFUSED_AT("{\"a\":tru}"), 8);
    CHECK_EQ(REFUSED_AT("{\"a\":truee}"), 9);
    CHECK_EQ(REFUSED_AT("{\"a\":True}"), 5);
    CHECK_EQ(REFUSED_AT("{\"a\":nul}"), 8);
    CHECK_EQ(REFUSED_AT("{\"a\":NaN}"), 5);
    CHECK_EQ(REFUSED_AT("{\"a\":nan}"), 6);
    CHECK_EQ(REFUSED_AT("{\"a\":Infinity}"), 5);
    CHECK_EQ(REFUSED_AT("{\"a\":fals}"), 9);
    CHECK_EQ(REFUSED_AT("{\"a\":nullx}"), 9);
}

static void numbers(void)
{
    static const char *const good[] = {"0", "-0", "1", "-1", "10", "1.5", "0.5", "-0.0",
                                       "1e5", "1E5", "1e+5", "1e-5", "1.25e-05", "0e0",
                                       "123456789", "-9.75E+300"};
    static const char *const bad[] = {"01", "-01", "00", "-00", "1.", "-", "+1", ".5", "1e",
                                      "1e+", "1.e5", "1ee5", "1e5e", "0x1", "-.5", "1.5.", "--1",
                                      "1e5.", "0.e1", "1-"};
    char doc[64];
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        snprintf(doc, sizeof doc, "{\"a\":%s}", good[i]);
        CHECK_MSG(feed_str(doc, strlen(doc)) == 1, "%s is refused", doc);
        snprintf(doc, sizeof doc, "{\"a\":[%s ,%s]}", good[i], good[i]);
        CHECK_MSG(feed_str(doc, strlen(doc)) == 1, "%s is refused", doc);
    }
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(doc, sizeof doc, "{\"a\":%s}", bad[i]);
        CHECK_MSG(feed_str(doc, strlen(doc)) == -1, "%s is accepted", doc);
    }
    /* a number may stop anywhere a value may, and only where it is whole */
    CHECK_EQ(FEED("{\"a\":-"), 0);
    CHECK_EQ(FEED("{\"a\":1."), 0);
    CHECK_EQ(FEED("{\"a\":1e-"), 0);
    CHECK_EQ(REFUSED_AT("{\"a\":1.}"), 7);
    CHECK_EQ(REFUSED_AT("{\"a\":-}"), 6);
    CHECK_EQ(REFUSED_AT("{\"a\":01}"), 6);
    CHECK_EQ(REFUSED_AT("{\"a\":1e}"), 7);
}

static void strings_and_escapes(void)
{
    CHECK_EQ(FEED("{\"a\":\"\\u12AbX\"}"), 1);
    CHECK_EQ(REFUSED_AT("{\"a\":\"\\x\"}"), 7);
    CHECK_EQ(REFUSED_AT("{\"a\":\"\\U1234\"}"), 7);
    CHECK_EQ(REFUSED_AT("{\"a\":\"\\u12\"}"), 10);
    CHECK_EQ(REFUSED_AT("{\"a\":\"\\u12g4\"}"), 10);
    CHECK_EQ(REFUSED_AT("{\"a\":\"\\'\"}"), 7);
    /* control characters only escaped: raw ones (newlines and tabs too) are refused */
    for (int c = 0; c < 0x20; c++) {
        char doc[16] = "{\"a\":\"x";
        size_t n = strlen(doc);
        doc[n] = (char)c;
        CHECK_MSG(refused_at(doc, n + 1) == (long)n, "control byte 0x%02x in a string", c);
    }
    CHECK_EQ(REFUSED_AT("{\"a\n\":1}"), 3);
    CHECK_EQ(FEED("{\"a\\n\":\"\\t\"}"), 1);
    /* long strings have no whitespace bound */
    char doc[200] = "{\"a\":\"";
    size_t n = strlen(doc);
    memset(doc + n, ' ', 100);
    memcpy(doc + n + 100, "\"}", 3);
    CHECK_EQ(feed_str(doc, strlen(doc)), 1);
}

static void utf8_in_strings(void)
{
    CHECK_EQ(FEED("{\"\xc3\xa9\":\"\xe2\x82\xac\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf\xee\x80\x80\"}"), 1);
    /* a character split across feeds */
    jsonmask_state st;
    jsonmask_init(&st);
    CHECK(jsonmask_feed(&st, "{\"a\":\"\xf0", 7));
    CHECK(jsonmask_feed(&st, "\x9f", 1));
    CHECK(jsonmask_feed(&st, "\x98", 1));
    CHECK(jsonmask_feed(&st, "\x80\"}", 3));
    CHECK(jsonmask_complete(&st));
    static const struct {
        const char *bytes;
        long at; /* the refused byte's offset within bytes */
    } bad[] = {
        {"\x80", 0},             /* a lone continuation byte */
        {"\xc0\x80", 0},         /* overlong */
        {"\xc1\xbf", 0},
        {"\xe0\x80\x80", 1},     /* overlong */
        {"\xe0\x9f\xbf", 1},
        {"\xed\xa0\x80", 1},     /* a surrogate */
        {"\xf0\x8f\xbf\xbf", 1}, /* overlong */
        {"\xf4\x90\x80\x80", 1}, /* past U+10FFFF */
        {"\xf5\x80", 0},
        {"\xff", 0},
        {"\xc3" "a", 1},         /* cut short */
        {"\xe2\x82\"", 2},
        {"\xc3\"", 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char doc[32] = "{\"a\":\"";
        size_t head = strlen(doc), n = strlen(bad[i].bytes);
        memcpy(doc + head, bad[i].bytes, n);
        long at = refused_at(doc, head + n);
        CHECK_MSG(at == (long)head + bad[i].at, "case %zu refused at %ld, not %ld", i, at,
                  (long)head + bad[i].at);
    }
    /* outside strings only ASCII structure */
    CHECK_EQ(REFUSED_AT("{\xc3\xa9"), 1);
}

static void depth_limit(void)
{
    char doc[8 * JSONMASK_DEPTH_MAX + 16];
    size_t n = 0;
    /* the object, then JSONMASK_DEPTH_MAX - 1 arrays: the deepest allowed */
    memcpy(doc, "{\"a\":", 5);
    n = 5;
    for (int i = 1; i < JSONMASK_DEPTH_MAX; i++)
        doc[n++] = '[';
    jsonmask_state st;
    jsonmask_init(&st);
    CHECK(jsonmask_feed(&st, doc, n));
    jsonmask_state deeper = st;
    CHECK(!jsonmask_feed(&deeper, "[", 1));
    deeper = st;
    CHECK(!jsonmask_feed(&deeper, "{", 1));
    /* the deepest level holds scalars and closes */
    size_t m = n;
    memcpy(doc + m, "1,\"s\",null", 10);
    m += 10;
    for (int i = 1; i < JSONMASK_DEPTH_MAX; i++)
        doc[m++] = ']';
    doc[m++] = '}';
    CHECK_EQ(feed_str(doc, m), 1);
    /* objects count as arrays do */
    n = 0;
    for (int i = 0; i < JSONMASK_DEPTH_MAX; i++, n += 5)
        memcpy(doc + n, "{\"k\":", 5);
    CHECK_EQ(refused_at(doc, n), -1);
    doc[n] = '{';
    CHECK_EQ(refused_at(doc, n + 1), (long)n);
    doc[n] = '1';
    CHECK_EQ(refused_at(doc, n + 1), -1);
    /* once closed, the depth may grow again */
    jsonmask_init(&st);
    CHECK(jsonmask_feed(&st, "{\"a\":[[]],\"b\":[[[]]]}", 21));
    CHECK(jsonmask_complete(&st));
}

static void whitespace_bound(void)
{
    char doc[128];
    for (int ws = JSONMASK_WS_MAX; ws <= JSONMASK_WS_MAX + 1; ws++) {
        bool ok = ws <= JSONMASK_WS_MAX;
        /* leading, after '{', before ':', after ',', before '}' */
        static const char *const where[][2] = {
            {"", "{}"}, {"{", "}"}, {"{\"a\"", ":1}"}, {"{\"a\":1,", "\"b\":2}"},
            {"{\"a\":1", "}"}, {"{\"a\":[", "]}"}, {"{\"a\":[1", "]}"}};
        for (size_t i = 0; i < sizeof where / sizeof *where; i++) {
            size_t n = 0;
            n += (size_t)snprintf(doc, sizeof doc, "%s", where[i][0]);
            memset(doc + n, i % 2 ? ' ' : '\n', (size_t)ws);
            n += (size_t)ws;
            n += (size_t)snprintf(doc + n, sizeof doc - n, "%s", where[i][1]);
            CHECK_MSG(feed_str(doc, n) == (ok ? 1 : -1), "%d whitespace bytes at place %zu", ws,
                      i);
        }
    }
    /* a run is of whitespace in a row: other bytes between runs reset it */
    size_t n = (size_t)snprintf(doc, sizeof doc, "{");
    for (int i = 0; i < 3; i++) {
        memset(doc + n, ' ', JSONMASK_WS_MAX);
        n += JSONMASK_WS_MAX;
        n += (size_t)snprintf(doc + n, sizeof doc - n, "\"%c\":1,", 'a' + i);
    }
    n += (size_t)snprintf(doc + n, sizeof doc - n, "\"z\":0}");
    CHECK_EQ(feed_str(doc, n), 1);
}

/* ---- against json-c ---- */

/* Whether json-c (strict, UTF-8 checked) parses s[0..n) as one object, ending at its '}'
 * (json-c also takes trailing whitespace, which jsonmask refuses: the reply ends at the
 * '}'). The generators below leave out what json-c is laxer about than RFC 8259, which
 * the tests above check on their own: raw control characters (whitespace is only ' '),
 * '.' and '0' (json-c takes "1." and "00"), NUL, 'I' (Infinity), '\'' and overlong or
 * surrogate UTF-8. */
static bool jsonc_object(const char *s, size_t n)
{
    struct json_tokener *tk = json_tokener_new_ex(64);
    if (!tk)
        return false;
    json_tokener_set_flags(tk, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    json_object *o = json_tokener_parse_ex(tk, s, (int)n);
    bool ok = o && json_object_is_type(o, json_type_object) &&
              json_tokener_get_parse_end(tk) == n && n > 0 && s[n - 1] == '}';
    json_object_put(o);
    json_tokener_free(tk);
    return ok;
}

typedef struct gen_buf {
    char b[4096];
    size_t n;
    uint64_t *rng;
} gen_buf;

static int pick(gen_buf *g, int n)
{
    return (int)(test_random(g->rng) % (uint64_t)n);
}

static void put(gen_buf *g, const char *s)
{
    size_t n = strlen(s);
    if (g->n + n < sizeof g->b)
        memcpy(g->b + g->n, s, n), g->n += n;
}

static void put_ws(gen_buf *g)
{
    static const char *const ws[] = {"", "", "", " ", "  "};
    put(g, ws[pick(g, 5)]);
}

static void put_string(gen_buf *g)
{
    static const char *const parts[] = {"a", "b", "key", "x y", "\xc3\xa9", "\xe2\x82\xac",
                                        "\xf0\x9f\x98\x80", "\\n", "\\\"", "\\\\", "\\/",
                                        "\\u12ab", "\\uD83D\\uDE00", "\\t", "1", "true"};
    put(g, "\"");
    for (int i = pick(g, 5); i > 0; i--)
        put(g, parts[pick(g, (int)(sizeof parts / sizeof *parts))]);
    put(g, "\"");
}

static void put_value(gen_buf *g, int depth);

static void put_object(gen_buf *g, int depth)
{
    put(g, "{");
    put_ws(g);
    for (int i = pick(g, depth > 6 ? 1 : 4), first = 1; i > 0; i--, first = 0) {
        if (!first) {
            put(g, ",");
            put_ws(g);
        }
        put_string(g);
        put_ws(g);
        put(g, ":");
        put_ws(g);
        put_value(g, depth + 1);
        put_ws(g);
    }
    put(g, "}");
}

static void put_value(gen_buf *g, int depth)
{
    static const char *const scalars[] = {"true", "false", "null", "1", "-7", "42", "9e5",
                                          "-3E-2", "1e+9", "123456789"};
    switch (pick(g, depth > 6 ? 2 : 4)) {
    case 0:
        put(g, scalars[pick(g, (int)(sizeof scalars / sizeof *scalars))]);
        break;
    case 1:
        put_string(g);
        break;
    case 2:
        put_object(g, depth);
        break;
    default:
        put(g, "[");
        put_ws(g);
        for (int i = pick(g, 4), first = 1; i > 0; i--, first = 0) {
            if (!first)
                put(g, ",");
            put_ws(g);
            put_value(g, depth + 1);
            put_ws(g);
        }
        put(g, "]");
    }
}

/* The bytes mutations and random strings are made of. */
static const char alphabet[] = "{}[]:,\" \\123456789-+eEtrufalsnxyu/bAF";

static void mutate(gen_buf *g)
{
    for (int k = 1 + pick(g, 3); k > 0 && g->n > 0; k--) {
        size_t at = (size_t)pick(g, (int)g->n);
        char c = alphabet[pick(g, (int)sizeof alphabet - 1)];
        switch (pick(g, 4)) {
        case 0: /* delete */
            memmove(g->b + at, g->b + at + 1, g->n - at - 1);
            g->n--;
            break;
        case 1: /* insert */
            if (g->n + 1 < sizeof g->b) {
                memmove(g->b + at + 1, g->b + at, g->n - at);
                g->b[at] = c;
                g->n++;
            }
            break;
        case 2: /* replace */
            g->b[at] = c;
            break;
        default: /* truncate */
            g->n = at;
        }
    }
}

static void agrees_with_json_c(void)
{
    uint64_t rng = 0x6a736f6e6d61736bu;
    test_random_seed(&rng);
    gen_buf g = {.rng = &rng};
    int complete = 0, rejected = 0, prefixes = 0;
    for (int round = 0; round < 30000; round++) {
        g.n = 0;
        int kind = pick(&g, 3);
        if (kind == 2) { /* a short random string of the alphabet, mostly an object's */
            put(&g, "{");
            for (int i = pick(&g, 10); i > 0; i--)
                g.b[g.n++] = alphabet[pick(&g, (int)sizeof alphabet - 1)];
        } else {
            put_ws(&g);
            put_object(&g, 0);
            if (kind == 1)
                mutate(&g);
        }
        bool want = jsonc_object(g.b, g.n);
        int got = feed_str(g.b, g.n);
        CHECK_MSG((got == 1) == want, "'%.*s': jsonmask %d, json-c %s", (int)g.n, g.b, got,
                  want ? "takes it" : "does not");
        complete += got == 1;
        rejected += got == -1;
        prefixes += got == 0;
        /* what json-c takes, every prefix of it is a valid prefix */
        if (want)
            for (size_t k = 0; k < g.n; k++)
                CHECK_MSG(feed_str(g.b, k) == 0, "'%.*s', a prefix of '%.*s'", (int)k, g.b,
                          (int)g.n, g.b);
    }
    /* the generators reach all three outcomes often */
    CHECK_MSG(complete > 3000 && rejected > 3000 && prefixes > 1000,
              "%d complete, %d refused, %d prefixes", complete, rejected, prefixes);
}

/* ---- tokens ---- */

typedef struct loaded_vocab {
    gguf_file *g;
    tokenizer *tok;
    jsonmask_vocab *v;
} loaded_vocab;

static void vocab_close(loaded_vocab *lv)
{
    jsonmask_vocab_free(lv->v);
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
        jsonmask_vocab_new(lv->tok, &lv->v, err)) {
        test_fail(__FILE__, __LINE__, "%s: %s", rel, err);
        vocab_close(lv);
        return false;
    }
    return true;
}

/* Whether token id is allowed by feeding its piece to a copy of st, byte by byte. */
static bool allowed_by_piece(const tokenizer *tok, const jsonmask_state *st, int32_t id)
{
    if (tok_is_eog(tok, id))
        return jsonmask_complete(st);
    enum tok_type type = tok_type(tok, id);
    if (type == TOK_TYPE_CONTROL || type == TOK_TYPE_UNKNOWN || type == TOK_TYPE_UNUSED)
        return false;
    char piece[1024];
    int n = tok_piece(tok, id, piece, sizeof piece);
    if (n <= 0 || n >= (int)sizeof piece)
        return false;
    jsonmask_state s = *st;
    for (int i = 0; i < n; i++)
        if (!jsonmask_feed(&s, piece + i, 1))
            return false;
    return true;
}

/* Takes the n tokens of ids one by one from c (at most 80); before each, every token's
 * verdict must be what feeding its piece byte by byte says. */
static void verdicts_match_pieces(const char *rel, loaded_vocab *lv, jsonmask_cursor *c,
                                  const int32_t *ids, int n)
{
    int32_t n_vocab = tok_n_vocab(lv->tok);
    for (int i = 0; i <= n && i < 80; i++) {
        for (int32_t id = 0; id < n_vocab; id++) {
            bool want = allowed_by_piece(lv->tok, &c->state, id);
            CHECK_MSG(jsonmask_allows(c, id) == want, "%s: token %d after %d tokens: %d, "
                      "its piece says %d", rel, id, i, !want, want);
        }
        if (i < n)
            CHECK_MSG(jsonmask_take(c, ids[i]) == 0, "%s: token %d of the document refused",
                      rel, i);
    }
    CHECK(!jsonmask_allows(c, -1) && !jsonmask_allows(c, n_vocab));
}

/* Tokenizes a generated document (and an unfinished tail) and checks every verdict along
 * it; then a schema's instance (length-bounded strings, whose plain tokens are counted,
 * keys, an enum, bounded integers, a pattern's and a format's strings). */
static void mask_matches_pieces(const char *rel)
{
    loaded_vocab lv;
    if (!vocab_open(rel, &lv))
        return;
    CHECK(jsonmask_vocab_size(lv.v) == tok_n_vocab(lv.tok));
    uint64_t rng = 0x746f6b656e6d61u;
    test_random_seed(&rng);
    gen_buf g = {.rng = &rng};
    put(&g, "{\"deep\":[[[[\"x\\u00e9\xc3\xa9 \"],-1.5e3],{\"k\":true}]],\"more\":");
    put_object(&g, 3);
    put(&g, ",\"tail\":[1,\"caf\xc3\xa9 ");
    int32_t ids[1024];
    int n = tok_encode(lv.tok, g.b, g.n, false, false, ids, 1024);
    CHECK(n > 0 && n <= 1024);
    jsonmask_cursor c;
    jsonmask_cursor_init(&c, lv.v);
    verdicts_match_pieces(rel, &lv, &c, ids, n);

    static const char schema_text[] =
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
        "\"n\":{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":200},"
        "\"maxItems\":4},\"kind\":{\"enum\":[\"alpha\",\"beta\"]},\"code\":{\"type\":\"string\","
        "\"pattern\":\"^[a-z ]+-\\\\d{2}\\\\n?$\"},\"when\":{\"type\":\"string\",\"format\":"
        "\"date\"},\"note\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":3}},"
        "\"required\":[\"name\",\"n\"]}";
    static const char instance[] =
        "{\"name\": \"caf\xc3\xa9 au lait\", \"n\": [3, 14, 159], \"kind\": \"beta\", \"code\": "
        "\"the code-42\\n\", \"when\": \"2024-02-29\", \"note\": \"ab";
    char err[ERR_MAX];
    jsonschema *schema = NULL;
    CHECK_MSG(jsonschema_compile(schema_text, strlen(schema_text), &schema, err) == 0, "%s", err);
    n = tok_encode(lv.tok, instance, strlen(instance), false, false, ids, 1024);
    CHECK(n > 0 && n <= 1024);
    jsonmask_cursor_init_schema(&c, lv.v, schema);
    verdicts_match_pieces(rel, &lv, &c, ids, n);
    jsonschema_free(schema);
    vocab_close(&lv);
}

static void mask_docs_vocab(void)
{
    mask_matches_pieces("models/docs-lm-21M-F16.gguf");
}

static void mask_llama_vocab(void)
{
    mask_matches_pieces("vocab/ggml-vocab-llama-spm.gguf");
}

static void mask_gpt2_vocab(void)
{
    mask_matches_pieces("vocab/ggml-vocab-gpt-2.gguf");
}

/* SentencePiece's '▁' and byte-fallback tokens give their bytes; control tokens none;
 * end of generation only after the object. */
static void pieces_and_end_of_generation(void)
{
    loaded_vocab lv;
    if (!vocab_open("models/docs-lm-21M-F16.gguf", &lv))
        return;
    int32_t brace = tok_find(lv.tok, "<0x7B>", 6), space_brace = tok_find(lv.tok, "\xe2\x96\x81{", 4);
    int32_t eos = tok_eos(lv.tok), bos = tok_bos(lv.tok);
    CHECK_MSG(brace >= 0, "no byte token <0x7B> in the docs vocabulary");
    jsonmask_cursor c;
    jsonmask_cursor_init(&c, lv.v);
    CHECK(jsonmask_allows(&c, brace));
    if (space_brace >= 0)
        CHECK(jsonmask_allows(&c, space_brace));
    CHECK(!jsonmask_allows(&c, eos));
    CHECK(!jsonmask_allows(&c, bos));
    CHECK_EQ(jsonmask_take(&c, eos), -1);
    CHECK_EQ(jsonmask_take(&c, brace), 0);
    CHECK(!jsonmask_allows(&c, brace)); /* a key or the end comes next */
    int32_t close = tok_find(lv.tok, "<0x7D>", 6);
    CHECK(close >= 0);
    CHECK(!jsonmask_allows(&c, eos));
    CHECK_EQ(jsonmask_take(&c, close), 0);
    CHECK(jsonmask_complete(&c.state));
    CHECK(jsonmask_allows(&c, eos));
    CHECK(!jsonmask_allows(&c, bos));
    CHECK(!jsonmask_allows(&c, brace));
    vocab_close(&lv);
}

/* ---- generation on a trained model ---- */

static bool cursor_allows(const void *ctx, int32_t token)
{
    return jsonmask_allows(ctx, token);
}

typedef struct json_run {
    char text[4096];
    size_t len;
    bool complete;
    int n_gen;
} json_run;

/* Generates at most max_gen tokens after prompt on m in JSON mode with params p. 0, or -1
 * with err. */
static int generate_json(model *m, const tokenizer *tok, const jsonmask_vocab *v,
                         const char *prompt, const sampler_params *p, int max_gen,
                         json_run *out, char err[ERR_MAX])
{
    int nv = model_hparams_of(m)->n_vocab, rc = -1;
    int32_t ids[512], pos[512], hist[1024];
    int n = tok_encode(tok, prompt, strlen(prompt), true, false, ids, 512);
    model_runner *r = model_runner_new(m, 2, 0, 0, err);
    kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
    sampler *smp = sampler_new(nv, p, err);
    float *logits = malloc(sizeof *logits * (size_t)nv);
    kv_seq seq;
    if (pool)
        kv_seq_init(&seq, pool);
    memset(out, 0, sizeof *out);
    if (n <= 0 || n > 512 || !r || !pool || !smp || !logits) {
        if (n <= 0 || n > 512 || !logits)
            err_set(err, "prompt of %d tokens, or out of memory", n);
        goto done;
    }
    jsonmask_cursor c;
    jsonmask_cursor_init(&c, v);
    sampler_constraint con = {cursor_allows, &c};
    memcpy(hist, ids, sizeof *ids * (size_t)n);
    int n_hist = n;
    for (int i = 0; i < n; i++)
        pos[i] = i;
    int32_t last = n - 1;
    model_batch b = {.n_tokens = n, .tokens = ids, .positions = pos, .n_out = 1,
                     .out_rows = &last, .logits = logits};
    if (model_forward(r, &seq, &b, err))
        goto done;
    while (out->n_gen < max_gen && !out->complete) {
        int32_t t = sampler_sample_allowed(smp, logits, hist, n_hist, &con);
        if (t < 0 || jsonmask_take(&c, t)) {
            err_set(err, "token %d after %d: not allowed", t, out->n_gen);
            goto done;
        }
        int len = tok_piece(tok, t, out->text + out->len, sizeof out->text - out->len);
        if (len < 0 || out->len + (size_t)len >= sizeof out->text) {
            err_set(err, "the reply outgrew its buffer");
            goto done;
        }
        out->len += (size_t)len;
        out->n_gen++;
        out->complete = jsonmask_complete(&c.state);
        hist[n_hist++] = t;
        int32_t at = n_hist - 1, row = 0;
        model_batch d = {.n_tokens = 1, .tokens = &t, .positions = &at, .n_out = 1,
                         .out_rows = &row, .logits = logits};
        if (!out->complete && model_forward(r, &seq, &d, err))
            goto done;
    }
    rc = 0;
done:
    free(logits);
    sampler_free(smp);
    if (pool)
        kv_seq_free(&seq);
    kv_pool_free(pool);
    model_runner_free(r);
    return rc;
}

/* Greedy and sampled (several seeds) JSON mode on the trained documentation model: what
 * it writes is a prefix of an object, and json-c parses every complete one as an
 * object. */
static void trained_model_writes_json_objects(void)
{
    const char *path = test_data_path("models/docs-lm-21M-F16.gguf");
    if (!path)
        SKIP("models/docs-lm-21M-F16.gguf is not in the test data");
    char err[ERR_MAX];
    model *m = model_load(path, err);
    CHECK_MSG(m, "%s", err);
    tokenizer *tok = NULL;
    jsonmask_vocab *v = NULL;
    CHECK_MSG(tok_load(model_gguf(m), &tok, err) == 0 && jsonmask_vocab_new(tok, &v, err) == 0,
              "%s", err);
    static const char *const prompts[] = {
        "The server reads its settings from config.json, for example:\n",
        "The response body is a JSON object such as\n"};
    int complete = 0, runs = 0;
#ifdef TEST_SANITIZED
    const int seeds = 5, max_gen = 64;
#else
    const int seeds = 6, max_gen = 160;
#endif
    for (size_t pi = 0; pi < sizeof prompts / sizeof *prompts; pi++)
        for (int seed = 0; seed <= seeds; seed++) {
            sampler_params p = sampler_params_default();
            p.seed = (uint64_t)seed;
            if (seed == 0)
                p.temperature = 0; /* greedy */
            json_run run;
            CHECK_MSG(generate_json(m, tok, v, prompts[pi], &p, max_gen, &run, err) == 0,
                      "%s", err);
            runs++;
            if (!run.complete) {
                CHECK_EQ(run.n_gen, max_gen); /* only the length cuts it short */
                continue;
            }
            complete++;
            CHECK_MSG(jsonc_object(run.text, run.len), "seed %d: '%s' is not an object to json-c",
                      seed, run.text);
        }
    /* the small model often repeats itself until the length runs out (greedy always
     * does here); some sampled replies close their object within a few dozen tokens */
    fprintf(stderr, "       %d of %d replies completed their object\n", complete, runs);
    CHECK_MSG(complete >= 3, "only %d of %d replies completed their object", complete, runs);
    jsonmask_vocab_free(v);
    tok_free(tok);
    model_free(m);
}

int main(void)
{
    RUN(whole_documents_are_complete);
    RUN(nothing_follows_the_object);
    RUN(top_level_must_be_an_object);
    RUN(structure_errors);
    RUN(literals);
    RUN(numbers);
    RUN(strings_and_escapes);
    RUN(utf8_in_strings);
    RUN(depth_limit);
    RUN(whitespace_bound);
    RUN(agrees_with_json_c);
    RUN(pieces_and_end_of_generation);
    RUN(mask_docs_vocab);
    RUN(mask_llama_vocab);
    RUN(mask_gpt2_vocab);
    RUN(trained_model_writes_json_objects);
    return test_finish();
}
