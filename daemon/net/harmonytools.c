/* harmonytools.c — a tool as gpt-oss's template writes it (harmonytools.h). */
#include "daemon/net/harmonytools.h"

#include <stdbool.h>
#include <string.h>

#include "engine/jsonesc.h"

static void put(struct printbuf *pb, const char *s)
{
    printbuf_memappend(pb, s, (int)strlen(s));
}

static void put_bytes(void *pb, const char *b, size_t n)
{
    printbuf_memappend(pb, b, (int)n);
}

/* A member of o, NULL when o is no object or lacks it. */
static json_object *member(json_object *o, const char *key)
{
    json_object *v;
    return json_object_is_type(o, json_type_object) && json_object_object_get_ex(o, key, &v)
               ? v
               : NULL;
}

/* Jinja's truth of a value: a non-empty string, array or object, a non-zero number,
 * true. */
static bool truthy(json_object *v)
{
    switch (json_object_get_type(v)) {
    case json_type_string:
        return json_object_get_string_len(v) > 0;
    case json_type_array:
        return json_object_array_length(v) > 0;
    case json_type_object:
        return json_object_object_length(v) > 0;
    case json_type_boolean:
        return json_object_get_boolean(v);
    case json_type_int:
        return json_object_get_int64(v) != 0;
    case json_type_double:
        return json_object_get_double(v) != 0;
    default:
        return false;
    }
}

/* Whether o's "type" is the string t. */
static bool type_is(json_object *o, const char *t)
{
    json_object *v = member(o, "type");
    return json_object_is_type(v, json_type_string) && strcmp(json_object_get_string(v), t) == 0;
}

/* A value as Jinja's string conversion (join, +) writes it: a string as it is, Python's
 * True, False and None, a number as JSON writes it. */
static void put_str(struct printbuf *pb, json_object *v)
{
    if (json_object_is_type(v, json_type_string))
        put(pb, json_object_get_string(v));
    else if (json_object_is_type(v, json_type_boolean))
        put(pb, json_object_get_boolean(v) ? "True" : "False");
    else if (!v)
        put(pb, "None");
    else
        put(pb, json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN |
                                                      JSON_C_TO_STRING_NOSLASHESCAPE));
}

/* A value as tojson writes it (json.dumps: ", " and ": ", nothing escaped past JSON's
 * own). */
static void put_json(struct printbuf *pb, json_object *v)
{
    bool first = true;
    switch (json_object_get_type(v)) {
    case json_type_string:
        put(pb, "\"");
        jsonesc_write(json_object_get_string(v), (size_t)json_object_get_string_len(v), put_bytes,
                      pb);
        put(pb, "\"");
        return;
    case json_type_object:
        put(pb, "{");
        json_object_object_foreach(v, key, val)
        {
            put(pb, first ? "\"" : ", \"");
            jsonesc_write(key, strlen(key), put_bytes, pb);
            put(pb, "\": ");
            put_json(pb, val);
            first = false;
        }
        put(pb, "}");
        return;
    case json_type_array:
        put(pb, "[");
        for (size_t i = 0; i < json_object_array_length(v); i++) {
            put(pb, i ? ", " : "");
            put_json(pb, json_object_array_get_idx(v, i));
        }
        put(pb, "]");
        return;
    case json_type_null:
        put(pb, "null");
        return;
    default:
        put(pb, json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN));
    }
}

/* Whether name is among the strings of required (an array, or anything: none). */
static bool is_required(json_object *required, const char *name)
{
    for (size_t i = 0; json_object_is_type(required, json_type_array) &&
                       i < json_object_array_length(required);
         i++) {
        json_object *r = json_object_array_get_idx(required, i);
        if (json_object_is_type(r, json_type_string) &&
            strcmp(json_object_get_string(r), name) == 0)
            return true;
    }
    return false;
}

static void put_type(struct printbuf *pb, json_object *spec);

/* An array's type: its items' ("string[]"...), "any[]" without items or for an item type
 * the template finds too long; " | null" after it when nullable. */
static void put_array_type(struct printbuf *pb, json_object *spec)
{
    static const char *const simple[][2] = {
        {"string", "string[]"}, {"number", "number[]"}, {"integer", "number[]"},
        {"boolean", "boolean[]"},
    };
    json_object *items = member(spec, "items");
    const char *done = truthy(items) ? NULL : "any[]";
    for (size_t i = 0; !done && i < sizeof simple / sizeof simple[0]; i++)
        if (type_is(items, simple[i][0]))
            done = simple[i][1];
    if (done) {
        put(pb, done);
    } else {
        struct printbuf *inner = printbuf_new();
        if (inner) {
            put_type(inner, items);
            bool any = inner->bpos > 50 || strcmp(inner->buf, "object | object") == 0;
            put(pb, any ? "any" : inner->buf);
            put(pb, "[]");
            printbuf_free(inner);
        }
    }
    if (truthy(member(spec, "nullable")))
        put(pb, " | null");
}

/* oneOf's variants, each with its description and default, joined by " | " and the line
 * break the template's endif leaves. (The template means to write "any" for a union with
 * object variants, but sets its flag inside the loop, where Jinja keeps it.) */
static void put_one_of(struct printbuf *pb, json_object *variants)
{
    size_t n = json_object_array_length(variants);
    for (size_t i = 0; i < n; i++) {
        json_object *v = json_object_array_get_idx(variants, i), *d;
        put_type(pb, v);
        if (truthy(d = member(v, "description"))) {
            put(pb, "// ");
            put_str(pb, d);
        }
        if (json_object_is_type(v, json_type_object) &&
            json_object_object_get_ex(v, "default", &d)) {
            put(pb, "                    // default: ");
            put_json(pb, d);
        }
        if (i + 1 < n)
            put(pb, " | \n");
    }
}

/* A nested object's type: its properties in braces, ", " between them, each after the
 * line break and indent the template leaves before its type. */
static void put_object_type(struct printbuf *pb, json_object *spec)
{
    json_object *props = member(spec, "properties"), *required = member(spec, "required");
    if (!truthy(props)) {
        put(pb, "object");
        return;
    }
    put(pb, "{\n");
    bool first = true;
    json_object_object_foreach(props, name, prop)
    {
        put(pb, first ? "" : ", ");
        put(pb, name);
        put(pb, is_required(required, name) ? ": \n                " : "?: \n                ");
        put_type(pb, prop);
        first = false;
    }
    put(pb, "}");
}

/* The template's render_typescript_type. */
static void put_type(struct printbuf *pb, json_object *spec)
{
    json_object *type = member(spec, "type"), *v;
    if (type_is(spec, "array")) {
        put_array_type(pb, spec);
    } else if (json_object_is_type(type, json_type_array) && json_object_array_length(type) > 0) {
        for (size_t i = 0; i < json_object_array_length(type); i++) {
            put(pb, i ? " | " : "");
            put_str(pb, json_object_array_get_idx(type, i));
        }
    } else if (truthy(v = member(spec, "oneOf")) && json_object_is_type(v, json_type_array)) {
        put_one_of(pb, v);
    } else if (type_is(spec, "string")) {
        if (truthy(v = member(spec, "enum")) && json_object_is_type(v, json_type_array)) {
            put(pb, "\"");
            for (size_t i = 0; i < json_object_array_length(v); i++) {
                put(pb, i ? "\" | \"" : "");
                put_str(pb, json_object_array_get_idx(v, i));
            }
            put(pb, "\"");
        } else {
            put(pb, truthy(member(spec, "nullable")) ? "string | null" : "string");
        }
    } else if (type_is(spec, "number") || type_is(spec, "integer")) {
        put(pb, "number");
    } else if (type_is(spec, "boolean")) {
        put(pb, "boolean");
    } else if (type_is(spec, "object")) {
        put_object_type(pb, spec);
    } else {
        put(pb, "any");
    }
}

/* A parameter's line: its description, name, type, default, and ",\n". */
static void put_parameter(struct printbuf *pb, const char *name, json_object *spec,
                          json_object *required)
{
    json_object *d = member(spec, "description"), *def;
    if (truthy(d)) {
        put(pb, "// ");
        put_str(pb, d);
        put(pb, "\n");
    }
    put(pb, name);
    put(pb, is_required(required, name) ? ": " : "?: ");
    put_type(pb, spec);
    if (json_object_is_type(spec, json_type_object) &&
        json_object_object_get_ex(spec, "default", &def)) {
        if (truthy(member(spec, "enum"))) {
            put(pb, ", // default: ");
            put_str(pb, def);
        } else if (truthy(member(spec, "oneOf"))) {
            put(pb, "// default: ");
            put_str(pb, def);
        } else {
            put(pb, ", // default: ");
            put_json(pb, def);
        }
    }
    put(pb, ",\n");
}

char *harmonytools_text(json_object *tool)
{
    json_object *fn = member(tool, "function");
    json_object *params = member(fn, "parameters"), *props = member(params, "properties");
    struct printbuf *pb = printbuf_new();
    if (!pb)
        return NULL;
    put(pb, "// ");
    json_object *d = member(fn, "description");
    if (d)
        put_str(pb, d);
    put(pb, "\ntype ");
    put_str(pb, member(fn, "name"));
    put(pb, " = ");
    if (truthy(params) && truthy(props) && json_object_is_type(props, json_type_object)) {
        put(pb, "(_: {\n");
        json_object *required = member(params, "required");
        json_object_object_foreach(props, name, spec)
            put_parameter(pb, name, spec, required);
        put(pb, "}) => any;\n\n");
    } else {
        put(pb, "() => any;\n\n");
    }
    char *s = strndup(pb->buf, (size_t)pb->bpos);
    printbuf_free(pb);
    return s;
}
