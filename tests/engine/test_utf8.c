/*
 * utf8: sequence validation, the byte ranges of a range of characters, a stream that never splits a character or lets an invalid
 * byte through whatever the piece boundaries, and JSON strings.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tok/utf8.h"
#include "tests/support/test.h"

static void sequences(void)
{
    CHECK_EQ(utf8_seq("a", 1), 1);
    CHECK_EQ(utf8_seq("\xc3\xa9", 2), 2);
    CHECK_EQ(utf8_seq("\xe2\x82\xac", 3), 3);
    CHECK_EQ(utf8_seq("\xf0\x9f\x98\x80", 4), 4);
    CHECK_EQ(utf8_seq("\xe2\x82", 2), -1);
    CHECK_EQ(utf8_seq("\xf0\x9f", 2), -1);
    CHECK_EQ(utf8_seq("\x81", 1), 0);              /* a lone continuation byte */
    CHECK_EQ(utf8_seq("\xc0\xaf", 2), 0);          /* overlong '/' */
    CHECK_EQ(utf8_seq("\xe0\x80\xaf", 3), 0);      /* overlong */
    CHECK_EQ(utf8_seq("\xed\xa0\x80", 3), 0);      /* a surrogate */
    CHECK_EQ(utf8_seq("\xf4\x90\x80\x80", 4), 0);  /* past U+10FFFF */
    CHECK_EQ(utf8_seq("\xc3" "a", 2), 0);
    CHECK_EQ(utf8_seq("\xff", 1), 0);
}

/* Whether the encoding of cp lies in the byte ranges of one of the parts. */
static int parts_holding(const utf8_range *parts, int n, uint32_t cp)
{
    char e[4];
    int len = (int)utf8_encode(cp, e), found = 0;
    for (int k = 0; k < n; k++) {
        bool in = parts[k].len == len;
        for (int i = 0; in && i < len; i++)
            in = (uint8_t)e[i] >= parts[k].lo[i] && (uint8_t)e[i] <= parts[k].hi[i];
        found += in;
    }
    return found;
}

/* The parts of a range hold as many byte strings as it has characters, each of its
 * characters in exactly one part and the characters around it in none; the ends of every
 * part are encodings of characters within the range. Every length boundary and 6-bit
 * boundary, and random ranges. */
static void ranges_split_into_byte_ranges(void)
{
    static const uint32_t edges[] = {0, 0x7F, 0x80, 0x7FF, 0x800, 0xFFF, 0x1000, 0xD7FF,
                                     0xE000, 0xFFFF, 0x10000, 0x3FFFF, 0x40000, 0x10FFFF};
    uint64_t rng = 0x7574663872616e67u;
    test_random_seed(&rng);
    for (int t = 0; t < 4000; t++) {
        uint32_t lo, hi;
        if (t < 196) {
            lo = edges[t / 14], hi = edges[t % 14];
        } else {
            lo = (uint32_t)(test_random(&rng) % 0x110000);
            hi = t % 2 ? lo + (uint32_t)(test_random(&rng) % 300) : (uint32_t)(test_random(&rng) % 0x110000);
        }
        if (lo > hi || hi > 0x10FFFF || (lo <= 0xDFFF && hi >= 0xD800))
            continue;
        utf8_range parts[UTF8_RANGES_MAX];
        int n = utf8_ranges(lo, hi, parts);
        CHECK(n >= 1 && n <= UTF8_RANGES_MAX);
        uint64_t strings = 0;
        for (int k = 0; k < n; k++) {
            uint64_t m = 1;
            for (int i = 0; i < parts[k].len; i++) {
                CHECK(parts[k].lo[i] <= parts[k].hi[i]);
                m *= (uint64_t)(parts[k].hi[i] - parts[k].lo[i] + 1);
            }
            strings += m;
            for (int end = 0; end < 2; end++) {
                const uint8_t *b = end ? parts[k].hi : parts[k].lo;
                CHECK_EQ(utf8_seq((const char *)b, parts[k].len), parts[k].len);
            }
        }
        CHECK_MSG(strings == (uint64_t)hi - lo + 1, "U+%X..U+%X: %llu byte strings", lo, hi,
                  (unsigned long long)strings);
        uint32_t probe[] = {lo, hi, lo + (hi - lo) / 2, lo + (hi - lo) / 3,
                            lo + (uint32_t)(test_random(&rng) % (hi - lo + 1))};
        for (size_t i = 0; i < sizeof probe / sizeof *probe; i++)
            CHECK_MSG(parts_holding(parts, n, probe[i]) == 1, "U+%X in U+%X..U+%X", probe[i], lo, hi);
        if (lo > 0 && lo - 1 != 0xDFFF)
            CHECK_EQ(parts_holding(parts, n, lo - 1), 0);
        if (hi < 0x10FFFF && hi + 1 != 0xD800)
            CHECK_EQ(parts_holding(parts, n, hi + 1), 0);
    }
    /* four-byte characters with both ends inside a block at every level: 7 parts */
    utf8_range parts[UTF8_RANGES_MAX];
    CHECK_EQ(utf8_ranges(0x10041, 0x10FFBE, parts), 7);
}

/* Feeds text in pieces of the given sizes (cycled) and returns the whole output. */
static size_t stream_in_pieces(const char *text, size_t n, const size_t *sizes, size_t n_sizes,
                               char *out, int *pieces_valid)
{
    utf8_stream u = {0};
    size_t o = 0;
    *pieces_valid = 1;
    for (size_t i = 0, k = 0; i < n; k++) {
        size_t take = sizes[k % n_sizes];
        if (take > n - i)
            take = n - i;
        size_t got = utf8_stream_feed(&u, text + i, take, out + o);
        *pieces_valid &= utf8_valid(out + o, got);
        o += got;
        i += take;
    }
    size_t got = utf8_stream_flush(&u, out + o);
    *pieces_valid &= utf8_valid(out + o, got);
    return o + got;
}

/* The encoder at each length's ends: the sequence utf8_seq reads back whole. */
static void encodes_each_length(void)
{
    static const struct {
        uint32_t cp;
        size_t len;
        const char *bytes;
    } cases[] = {
        {0x0, 1, "\x00"},           {0x7F, 1, "\x7f"},           {0x80, 2, "\xc2\x80"},
        {0x7FF, 2, "\xdf\xbf"},     {0x800, 3, "\xe0\xa0\x80"}, {0xFFFF, 3, "\xef\xbf\xbf"},
        {0x10000, 4, "\xf0\x90\x80\x80"}, {0x10FFFF, 4, "\xf4\x8f\xbf\xbf"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char buf[4];
        size_t n = utf8_encode(cases[i].cp, buf);
        CHECK_MSG(n == cases[i].len && !memcmp(buf, cases[i].bytes, n) &&
                      utf8_seq(buf, n) == (int)n,
                  "U+%04X: %zu bytes", (unsigned)cases[i].cp, n);
    }
}

static void stream_holds_unfinished_characters(void)
{
    const char text[] = "h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80!";
    size_t n = sizeof text - 1;
    static const size_t sizes[][3] = {{1, 1, 1}, {2, 3, 1}, {3, 1, 2}, {64, 64, 64}};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        char out[UTF8_OUT_CAP(sizeof text)];
        int ok;
        size_t o = stream_in_pieces(text, n, sizes[s], 3, out, &ok);
        CHECK_MSG(ok, "a piece was not valid UTF-8 (sizes %zu)", s);
        CHECK_EQ(o, n);
        CHECK(memcmp(out, text, n) == 0);
    }
}

/* Checks that text (n bytes) streamed a byte at a time and all at once comes out as
 * want (want_n bytes), with no NUL byte in it. */
static void check_streamed_as(const char *text, size_t n, const char *want, size_t want_n)
{
    static const size_t ones[] = {1}, whole[] = {64};
    const size_t *sizes[] = {ones, whole};
    for (int s = 0; s < 2; s++) {
        char out[UTF8_OUT_CAP(64)];
        int ok;
        size_t o = stream_in_pieces(text, n, sizes[s], 1, out, &ok);
        CHECK(ok);
        CHECK_MSG(o == want_n && memcmp(out, want, o) == 0, "got %zu bytes: %.*s", o, (int)o,
                  out);
        CHECK_MSG(!memchr(out, '\0', o), "a NUL byte came out");
    }
}

static void stream_replaces_invalid_bytes(void)
{
    /* a stray continuation byte, a character cut by an ASCII byte, an unfinished end */
    const char text[] = "a\x81" "b\xe2\x82" "c\xf0\x9f";
    const char want[] = "a\xef\xbf\xbd" "b\xef\xbf\xbd\xef\xbf\xbd" "c\xef\xbf\xbd";
    check_streamed_as(text, sizeof text - 1, want, sizeof want - 1);
    /* the worst case fits UTF8_OUT_CAP: three held bytes and one that voids them */
    utf8_stream u = {0};
    char out[UTF8_OUT_CAP(4)];
    CHECK_EQ(utf8_stream_feed(&u, "\xf0\x9f\x98", 3, out), 0);
    CHECK_EQ(utf8_stream_feed(&u, "\xf0", 1, out), 9);
    CHECK_EQ(utf8_stream_flush(&u, out), 3);
    CHECK_EQ(utf8_stream_flush(&u, out), 0);
}

/* A generated NUL byte (a byte-fallback token) would cut the C string the text leaves as
 * (protobuf-c): it leaves as U+FFFD, alone or beside a held character. */
static void stream_replaces_nul_bytes(void)
{
    const char text[] = "a\0b\xc3\0";
    const char want[] = "a\xef\xbf\xbd" "b\xef\xbf\xbd\xef\xbf\xbd";
    check_streamed_as(text, sizeof text - 1, want, sizeof want - 1);
}

static void json_strings(void)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK(f);
    utf8_json_string(f, "q\"b\\n\nt\t\x01\x7f \xc3\xa9 \x81\xff end");
    fputc(' ', f);
    utf8_json_string(f, NULL);
    fclose(f);
    const char want[] =
        "\"q\\\"b\\\\n\\nt\\t\\u0001\\u007f \xc3\xa9 \\ufffd\\ufffd end\" null";
    CHECK_MSG(strcmp(buf, want) == 0, "got %s", buf);
    free(buf);
}

int main(void)
{
    RUN(sequences);
    RUN(encodes_each_length);
    RUN(ranges_split_into_byte_ranges);
    RUN(stream_holds_unfinished_characters);
    RUN(stream_replaces_invalid_bytes);
    RUN(stream_replaces_nul_bytes);
    RUN(json_strings);
    return test_finish();
}
