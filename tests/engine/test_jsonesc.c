/*
 * jsonesc: every ASCII byte written as the inside of a JSON string reads back as itself
 * through json-c, the named escapes are Python's json.dumps', and bytes from 0x80 pass
 * as they are (UTF-8 text stays text).
 */
#include <json-c/json.h>
#include <stdio.h>
#include <string.h>

#include "engine/jsonesc.h"
#include "tests/support/test.h"

typedef struct sink {
    char buf[64];
    size_t len;
} sink;

static void put(void *p, const char *b, size_t n)
{
    sink *s = p;
    memcpy(s->buf + s->len, b, n);
    s->len += n;
}

static void every_ascii_byte_reads_back(void)
{
    for (int c = 0; c < 0x80; c++) {
        char in[3] = {'a', (char)c, 'z'};
        sink s = {.buf = "\"", .len = 1};
        jsonesc_write(in, 3, put, &s);
        put(&s, "\"", 2);
        json_object *o = json_tokener_parse(s.buf);
        CHECK_MSG(o && json_object_get_string_len(o) == 3 &&
                      memcmp(json_object_get_string(o), in, 3) == 0,
                  "byte 0x%02x written as %s", c, s.buf);
        json_object_put(o);
    }
}

static void escapes_are_python_json_dumps(void)
{
    static const struct {
        unsigned char c;
        const char *esc;
    } cases[] = {{'"', "\\\""}, {'\\', "\\\\"}, {'\n', "\\n"}, {'\r', "\\r"}, {'\t', "\\t"},
                 {'\b', "\\b"}, {'\f', "\\f"}, {0, "\\u0000"}, {0x1f, "\\u001f"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char esc[JSONESC_MAX];
        CHECK(jsonesc_needed(cases[i].c));
        CHECK_MSG(!strcmp(jsonesc_byte(cases[i].c, esc), cases[i].esc), "0x%02x: %s",
                  cases[i].c, esc);
    }
    CHECK(!jsonesc_needed('/') && !jsonesc_needed(0x7f) && !jsonesc_needed(0xc3));
    sink s = {.len = 0};
    jsonesc_write("caf\xc3\xa9/", 6, put, &s);
    CHECK(s.len == 6 && memcmp(s.buf, "caf\xc3\xa9/", 6) == 0);
}

int main(void)
{
    RUN(every_ascii_byte_reads_back);
    RUN(escapes_are_python_json_dumps);
    return test_finish();
}
