/*
 * toolcall.c — tools read from a request, rendered with the conversation, and calls
 * scanned out of replies (toolcall.h).
 */
#include "daemon/net/toolcall.h"

#include <json-c/printbuf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "daemon/net/harmonytools.h"
#include "daemon/net/jsonfield.h"
#include "engine/jsonesc.h"
#include "engine/tok/chatharmony.h"
#include "engine/tok/textwriter.h"

/* ---- JSON as the templates' tojson writes it ---- */

static void printbuf_put(void *pb, const char *b, size_t n)
{
    printbuf_memappend(pb, b, (int)n);
}

/* A string as Python's json.dumps(ensure_ascii=False) writes it. */
static void dump_string(struct printbuf *pb, const char *s, size_t n)
{
    printbuf_memappend(pb, "\"", 1);
    jsonesc_write(s, n, printbuf_put, pb);
    printbuf_memappend(pb, "\"", 1);
}

static void newline_indent(struct printbuf *pb, int indent, int depth)
{
    printbuf_memappend(pb, "\n", 1);
    for (int i = 0; i < indent * depth; i++)
        printbuf_memappend(pb, " ", 1);
}

/* v as Hugging Face's tojson writes it (json.dumps, keys in their order): on one line
 * with ", " and ": " (indent 0), or indented with "," and ": ". */
static void dump(struct printbuf *pb, json_object *v, int indent, int depth)
{
    const char *item_sep = indent ? "," : ", ";
    bool first = true;
    switch (json_object_get_type(v)) {
    case json_type_object:
        if (json_object_object_length(v) == 0) {
            printbuf_memappend(pb, "{}", 2);
            return;
        }
        printbuf_memappend(pb, "{", 1);
        json_object_object_foreach(v, key, val)
        {
            if (!first)
                printbuf_memappend(pb, item_sep, (int)strlen(item_sep));
            if (indent)
                newline_indent(pb, indent, depth + 1);
            dump_string(pb, key, strlen(key));
            printbuf_memappend(pb, ": ", 2);
            dump(pb, val, indent, depth + 1);
            first = false;
        }
        if (indent)
            newline_indent(pb, indent, depth);
        printbuf_memappend(pb, "}", 1);
        return;
    case json_type_array:
        if (json_object_array_length(v) == 0) {
            printbuf_memappend(pb, "[]", 2);
            return;
        }
        printbuf_memappend(pb, "[", 1);
        for (size_t i = 0; i < json_object_array_length(v); i++) {
            if (i)
                printbuf_memappend(pb, item_sep, (int)strlen(item_sep));
            if (indent)
                newline_indent(pb, indent, depth + 1);
            dump(pb, json_object_array_get_idx(v, i), indent, depth + 1);
        }
        if (indent)
            newline_indent(pb, indent, depth);
        printbuf_memappend(pb, "]", 1);
        return;
    case json_type_string:
        dump_string(pb, json_object_get_string(v), (size_t)json_object_get_string_len(v));
        return;
    default: {
        const char *s = json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN);
        printbuf_memappend(pb, s, (int)strlen(s));
    }
    }
}

/* dump into a fresh string (NULL out of memory). */
static char *dump_text(json_object *v, int indent)
{
    struct printbuf *pb = printbuf_new();
    if (!pb)
        return NULL;
    dump(pb, v, indent, 0);
    char *s = strndup(pb->buf, (size_t)pb->bpos);
    printbuf_free(pb);
    return s;
}

/* A tool as Mistral Nemo's template writes it: {"type": "function", "function": {...}}
 * whatever the tool's own keys, then the function's keys in their order but "return",
 * a string value between quotes as it is (the template does not escape it), any other
 * as tojson. Fresh string, NULL out of memory. */
static char *mistral_tool_text(json_object *tool)
{
    json_object *fn = json_object_object_get(tool, "function");
    struct printbuf *pb = printbuf_new();
    if (!pb)
        return NULL;
    printbuf_strappend(pb, "{\"type\": \"function\", \"function\": {");
    bool first = true;
    json_object_object_foreach(fn, key, val)
    {
        if (strcmp(key, "return") == 0)
            continue;
        sprintbuf(pb, "%s\"%s\": ", first ? "" : ", ", key);
        if (json_object_is_type(val, json_type_string))
            sprintbuf(pb, "\"%s\"", json_object_get_string(val));
        else
            dump(pb, val, 0, 0);
        first = false;
    }
    printbuf_strappend(pb, "}}");
    char *s = strndup(pb->buf, (size_t)pb->bpos);
    printbuf_free(pb);
    return s;
}

/* ---- Hermes' tools ---- */

static void put(struct printbuf *pb, const char *s)
{
    printbuf_memappend(pb, s, (int)strlen(s));
}

/* The Python type Hermes' template (its macro json_to_python_type) writes for a type
 * name: "str", "float", "int", "bool", "list[Union[]]" (the macro loses an array's items:
 * it asks the type of json_spec|items, an iterator), "dict". A name it does not know
 * ("null", "any") it takes for a list of names, one letter each, and recurses until Python
 * gives up: here "Any", its answer for a type it does not know. */
static void hermes_named_type(struct printbuf *pb, const char *t)
{
    static const char *const names[][2] = {
        {"string", "str"}, {"number", "float"}, {"integer", "int"}, {"boolean", "bool"},
        {"array", "list[Union[]]"}, {"object", "dict"}, {"", "Union[]"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(t, names[i][0]) == 0) {
            put(pb, names[i][1]);
            return;
        }
    put(pb, "Any");
}

/* ... for a "type" value: a name's, "Union[...]" over a list of them (or an object's
 * keys, which Jinja iterates), "Any" for JSON's other values. */
static void hermes_type_name(struct printbuf *pb, json_object *t)
{
    bool first = true;
    switch (json_object_get_type(t)) {
    case json_type_string:
        hermes_named_type(pb, json_object_get_string(t));
        return;
    case json_type_array:
        put(pb, "Union[");
        for (size_t i = 0; i < json_object_array_length(t); i++) {
            put(pb, i ? "," : "");
            hermes_type_name(pb, json_object_array_get_idx(t, i));
        }
        put(pb, "]");
        return;
    case json_type_object:
        put(pb, "Union[");
        json_object_object_foreach(t, key, val)
        {
            (void)val;
            put(pb, first ? "" : ",");
            hermes_named_type(pb, key);
            first = false;
        }
        put(pb, "]");
        return;
    default:
        put(pb, "Any");
    }
}

/* The Python type of a schema: its "type"'s, "dict[str, ...]" for an object whose
 * additionalProperties say what its values are; "Union[]" without a type (the macro
 * iterates over the undefined value). */
static void hermes_type(struct printbuf *pb, json_object *schema)
{
    json_object *t, *values;
    if (!json_object_is_type(schema, json_type_object) ||
        !json_object_object_get_ex(schema, "type", &t)) {
        put(pb, "Union[]");
    } else if (json_object_is_type(t, json_type_string) &&
               strcmp(json_object_get_string(t), "object") == 0 &&
               json_object_object_get_ex(schema, "additionalProperties", &values)) {
        put(pb, "dict[str, ");
        hermes_type(pb, values);
        put(pb, "]");
    } else {
        hermes_type_name(pb, t);
    }
}

/* The description of o (a property's or the return's schema): *s its text (NULL without
 * one). 0, or -1 with msg naming field when it is not a string: the template would write
 * a property's as Python's str() of the value, and raises on the return's. */
static int hermes_description(json_object *o, const char *field, const char **s, char *msg,
                              size_t cap)
{
    json_object *d;
    *s = NULL;
    if (!json_object_is_type(o, json_type_object) || !json_object_object_get_ex(o, "description", &d))
        return 0;
    if (!json_object_is_type(d, json_type_string)) {
        snprintf(msg, cap, "%s.description must be a string", field);
        return -1;
    }
    *s = json_object_get_string(d);
    return 0;
}

/* A property's description as the template's "|trim" writes it. */
static void put_trimmed(struct printbuf *pb, const char *s)
{
    size_t n = strlen(s);
    while (n > 0 && textwriter_is_space(*s))
        s++, n--;
    while (n > 0 && textwriter_is_space(s[n - 1]))
        n--;
    printbuf_memappend(pb, s, (int)n);
}

/* A tool as Hermes' tool_use template writes it: {"type": "function", "function":
 * {"name": ..., "description": "name(a: str, ...) -> R - description\n\n    Args:\n
 *         a(str): its description...\n    Returns:\n        ...", "parameters": ...}
 * (the outer object left open, as the template leaves it): the "Args:" lines one after
 * the other, the names and descriptions as they are (quotes unescaped), the parameters as
 * tojson, or {} without properties; " -> R" and "Returns:" from the function's "return"
 * schema. A function without parameters or a description, on which the template raises,
 * is written as one with {} and "". Fresh string, or NULL with msg (tools[i] named):
 * properties that are not an object, or a description not a string. */
static char *hermes_tool_text(json_object *tool, size_t i, char *msg, size_t cap)
{
    json_object *fn = json_object_object_get(tool, "function"), *params = NULL, *props = NULL;
    json_object *ret = NULL, *d = json_object_object_get(fn, "description");
    const char *name = json_object_get_string(json_object_object_get(fn, "name"));
    const char *desc = d ? json_object_get_string(d) : "", *ret_desc = NULL;
    char field[128];
    bool has_return = json_object_object_get_ex(fn, "return", &ret);
    if (json_object_object_get_ex(fn, "parameters", &params) &&
        json_object_object_get_ex(params, "properties", &props) &&
        !json_object_is_type(props, json_type_object)) {
        snprintf(msg, cap, "tools[%zu].function.parameters.properties must be an object", i);
        return NULL;
    }
    snprintf(field, sizeof field, "tools[%zu].function.return", i);
    if (has_return && hermes_description(ret, field, &ret_desc, msg, cap) < 0)
        return NULL;
    struct printbuf *pb = printbuf_new();
    if (!pb) {
        snprintf(msg, cap, "out of memory");
        return NULL;
    }
    sprintbuf(pb, "{\"type\": \"function\", \"function\": {\"name\": \"%s\", \"description\": \"%s(",
              name, name);
    bool first = true, bad = false;
    if (props) {
        json_object_object_foreach(props, key, val)
        {
            sprintbuf(pb, "%s%s: ", first ? "" : ", ", key);
            hermes_type(pb, val);
            first = false;
        }
    }
    put(pb, ")");
    if (has_return) {
        put(pb, " -> ");
        hermes_type(pb, ret);
    }
    sprintbuf(pb, " - %s\n\n", desc);
    first = true;
    if (props) {
        json_object_object_foreach(props, pkey, pval)
        {
            const char *pd;
            snprintf(field, sizeof field, "tools[%zu].function.parameters.properties.%.64s", i,
                     pkey);
            if ((bad = hermes_description(pval, field, &pd, msg, cap) < 0))
                break;
            sprintbuf(pb, "%s        %s(", first ? "    Args:\n" : "", pkey);
            hermes_type(pb, pval);
            put(pb, "): ");
            put_trimmed(pb, pd ? pd : "");
            first = false;
        }
    }
    if (bad) {
        printbuf_free(pb);
        return NULL;
    }
    if (ret_desc)
        sprintbuf(pb, "\n    Returns:\n        %s", ret_desc);
    put(pb, "\", \"parameters\": ");
    if (props && json_object_object_length(props) > 0)
        dump(pb, params, 0, 0);
    else
        put(pb, "{}");
    put(pb, "}");
    char *s = strndup(pb->buf, (size_t)pb->bpos);
    printbuf_free(pb);
    if (!s)
        snprintf(msg, cap, "out of memory");
    return s;
}

/* A tool's definition (tools[i]) as the family's template writes it. Fresh string, or
 * NULL with msg. */
static char *tool_text(json_object *tool, enum chat_family f, size_t i, char *msg, size_t cap)
{
    if (f == CHAT_HERMES)
        return hermes_tool_text(tool, i, msg, cap);
    char *s = f == CHAT_MISTRAL_V3_TEKKEN ? mistral_tool_text(tool)
              : f == CHAT_GPT_OSS         ? harmonytools_text(tool)
                                          : dump_text(tool, chat_tools_indent(f));
    if (!s)
        snprintf(msg, cap, "out of memory");
    return s;
}

/* ---- reading tools ---- */

/* "tool_choice" into ts: "auto" (the default) reads replies for calls; "none" keeps the
 * tools in the prompt, as llama.cpp does, and leaves the reply text; "required" and a
 * function (*named) force a call. */
static int read_choice(json_object *body, toolcall_set *ts, const char **named, char *msg,
                       size_t cap)
{
    json_object *v, *fn, *name;
    ts->parse = true;
    *named = NULL;
    if (!json_object_object_get_ex(body, "tool_choice", &v) || json_object_is_type(v, json_type_null))
        return 0;
    const char *s = json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
    if (s && strcmp(s, "auto") == 0)
        return 0;
    if (s && strcmp(s, "none") == 0) {
        ts->parse = false;
        return 0;
    }
    if (s && strcmp(s, "required") == 0) {
        ts->forced = true;
        ts->forced_fn = TOOLCALL_ANY_FN;
        return 0;
    }
    if (json_object_is_type(v, json_type_object) && json_object_object_get_ex(v, "function", &fn) &&
        json_object_object_get_ex(fn, "name", &name) && json_object_is_type(name, json_type_string)) {
        ts->forced = true;
        *named = json_object_get_string(name);
        return 0;
    }
    snprintf(msg, cap, "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": "
                       "\"function\", \"function\": {\"name\": ...}}");
    return -1;
}

/* The object of a call of function i in the family's syntax: {"name": its name,
 * args_key: its parameters (none: {})}, both required. NULL out of memory. */
static json_object *call_schema(const toolcall_set *ts, size_t i)
{
    const char *args_key = chat_tool_syntax(ts->family)->args_key;
    json_object *call = json_object_new_object(), *props = json_object_new_object();
    json_object *name = json_object_new_object(), *required = json_object_new_array();
    json_object *args = ts->params[i] ? json_object_get(ts->params[i]) : json_object_new_object();
    if (!call || !props || !name || !required || !args) {
        json_object_put(call);
        json_object_put(props);
        json_object_put(name);
        json_object_put(required);
        json_object_put(args);
        return NULL;
    }
    if (!ts->params[i]) {
        json_object_object_add(args, "type", json_object_new_string("object"));
        json_object_object_add(args, "properties", json_object_new_object());
    }
    json_object_object_add(name, "const", json_object_new_string(ts->names[i]));
    json_object_object_add(props, "name", name);
    json_object_object_add(props, args_key, args);
    json_object_array_add(required, json_object_new_string("name"));
    json_object_array_add(required, json_object_new_string(args_key));
    json_object_object_add(call, "type", json_object_new_string("object"));
    json_object_object_add(call, "properties", props);
    json_object_object_add(call, "required", required);
    return call;
}

/* gpt-oss's call of the function named (ts->forced_fn): its header after the prompt's
 * "<|start|>assistant", as the model writes a call, and its opening as harmony.h gives it
 * to the scan; the schema, its arguments'. 0, or -1 out of memory. */
static int harmony_forced(toolcall_set *ts, json_object **schema)
{
    const char *name = ts->names[ts->forced_fn];
    json_object *args = ts->params[ts->forced_fn], *quoted = json_object_new_string(name);
    *schema = args ? json_object_get(args) : json_object_new_object();
    if (!args && *schema) {
        json_object_object_add(*schema, "type", json_object_new_string("object"));
        json_object_object_add(*schema, "properties", json_object_new_object());
    }
    int plain = JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE;
    const char *q = quoted ? json_object_to_json_string_ext(quoted, plain) : NULL;
    if (q && asprintf(&ts->header, "<|channel|>commentary to=functions.%s <|constrain|>json"
                                   "<|message|>", name) < 0)
        ts->header = NULL;
    if (q && asprintf(&ts->call_open, "<tool_call>\n{\"name\": %s, \"arguments\": ", q) < 0)
        ts->call_open = NULL;
    json_object_put(quoted);
    return *schema && ts->header && ts->call_open ? 0 : -1;
}

/* The forced call's schema (see toolcall_read) into ts->schema: the call of the function
 * named, or one of every function's calls (a tagged union: the name, written first,
 * chooses whose parameters the arguments follow). 0, or -1 with msg. */
static int forced_schema(toolcall_set *ts, char *msg, size_t cap)
{
    json_object *schema = NULL;
    if (ts->family == CHAT_GPT_OSS) {
        if (harmony_forced(ts, &schema) < 0) {
            json_object_put(schema);
            schema = NULL;
        }
    } else if (ts->forced_fn >= 0 || ts->n == 1) {
        schema = call_schema(ts, ts->forced_fn >= 0 ? (size_t)ts->forced_fn : 0);
    } else if ((schema = json_object_new_object())) {
        json_object *calls = json_object_new_array();
        json_object_object_add(schema, "oneOf", calls);
        for (size_t i = 0; calls && i < ts->n; i++)
            if (json_object_array_add(calls, call_schema(ts, i)) < 0 ||
                !json_object_array_get_idx(calls, i))
                calls = NULL;
        if (!calls) {
            json_object_put(schema);
            schema = NULL;
        }
    }
    if (schema)
        ts->schema = strdup(json_object_to_json_string_ext(
            schema, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
    json_object_put(schema);
    if (!ts->schema) {
        snprintf(msg, cap, "out of memory");
        return -1;
    }
    return 0;
}

/* tools[i]: {"type": "function", "function": {"name", "description"?, "parameters"?}};
 * its name in *name, its parameters schema in *params (NULL: none). 0, or -1 with msg
 * naming the field. */
static int check_tool(json_object *t, size_t i, const char **name, json_object **params,
                      char *msg, size_t cap)
{
    json_object *type, *fn, *v;
    if (!json_object_is_type(t, json_type_object)) {
        snprintf(msg, cap, "tools[%zu] must be an object", i);
        return -1;
    }
    if (json_object_object_get_ex(t, "type", &type) &&
        !(json_object_is_type(type, json_type_string) &&
          strcmp(json_object_get_string(type), "function") == 0)) {
        snprintf(msg, cap, "tools[%zu].type must be \"function\"", i);
        return -1;
    }
    if (!json_object_object_get_ex(t, "function", &fn) || !json_object_is_type(fn, json_type_object)) {
        snprintf(msg, cap, "tools[%zu].function must be an object", i);
        return -1;
    }
    if (!json_object_object_get_ex(fn, "name", &v) || !json_object_is_type(v, json_type_string) ||
        json_object_get_string_len(v) == 0) {
        snprintf(msg, cap, "tools[%zu].function.name must be a non-empty string", i);
        return -1;
    }
    *name = json_object_get_string(v);
    if (json_object_object_get_ex(fn, "parameters", &v) && !json_object_is_type(v, json_type_null) &&
        !json_object_is_type(v, json_type_object)) {
        snprintf(msg, cap, "tools[%zu].function.parameters must be an object (a JSON schema)", i);
        return -1;
    }
    *params = json_object_object_get_ex(fn, "parameters", &v) &&
                      json_object_is_type(v, json_type_object) && json_object_object_length(v)
                  ? v
                  : NULL;
    if (json_object_object_get_ex(fn, "description", &v) && !json_object_is_type(v, json_type_null) &&
        !json_object_is_type(v, json_type_string)) {
        snprintf(msg, cap, "tools[%zu].function.description must be a string", i);
        return -1;
    }
    return 0;
}

int toolcall_read(json_object *body, enum chat_family f, toolcall_set *ts, char *msg, size_t cap)
{
    json_object *tools, *v;
    const char *named;
    memset(ts, 0, sizeof *ts);
    ts->family = f;
    if (read_choice(body, ts, &named, msg, cap) < 0)
        return -1;
    /* a call of any function is gpt-oss's header naming it, then its arguments: the
     * header is no JSON, which the reply's schema could constrain */
    if (ts->forced && !named && f == CHAT_GPT_OSS) {
        snprintf(msg, cap, "'tool_choice': \"required\" is not supported for gpt-oss, whose "
                           "call names its function in a header the reply writes; name the "
                           "function ({\"type\": \"function\", \"function\": {\"name\": "
                           "...}}) or send \"auto\"");
        return -1;
    }
    int rc = jsonfield_get(body, "parallel_tool_calls", "", json_type_boolean, &v, msg, cap);
    if (rc < 0)
        return -1;
    ts->first_only = rc == 1 && !json_object_get_boolean(v);
    if ((rc = jsonfield_get(body, "tools", "", json_type_array, &tools, msg, cap)) < 0)
        return rc;
    size_t n = rc ? json_object_array_length(tools) : 0;
    if (n == 0) {
        if (ts->forced) {
            snprintf(msg, cap, "'tool_choice' forces a call, and there are no 'tools'");
            return -1;
        }
        return 0;
    }
    if (!chat_tool_syntax(f)) {
        snprintf(msg, cap, "'tools': the model's chat template (%s) has no tool format (tools "
                           "are supported with chatml, qwen3, qwen3-thinking, hermes, llama3, "
                           "gpt-oss and Mistral Nemo's mistral-v3-tekken templates)",
                 chat_family_name(f));
        return -1;
    }
    ts->defs = calloc(n, sizeof *ts->defs);
    ts->names = calloc(n, sizeof *ts->names);
    ts->params = calloc(n, sizeof *ts->params);
    if (named)
        ts->forced_fn = TOOLCALL_ANY_FN; /* until the loop finds the function named */
    if (!ts->defs || !ts->names || !ts->params) {
        snprintf(msg, cap, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        json_object *t = json_object_array_get_idx(tools, i);
        if (check_tool(t, i, &ts->names[i], &ts->params[i], msg, cap) < 0)
            return -1;
        if (!(ts->defs[i] = tool_text(t, f, i, msg, cap)))
            return -1;
        ts->n = i + 1;
        if (named && strcmp(named, ts->names[i]) == 0)
            ts->forced_fn = (int)i;
    }
    if (named && ts->forced_fn < 0) {
        snprintf(msg, cap, "'tool_choice' names the function '%.64s', which is not in 'tools'",
                 named);
        return -1;
    }
    return ts->forced ? forced_schema(ts, msg, cap) : 0;
}

int toolcall_constrain(const toolcall_set *ts, Llms__GenerationParams *p, char *msg, size_t cap)
{
    if (!ts->forced)
        return 0;
    if (p->has_format && p->format != LLMS__RESPONSE_FORMAT__FORMAT_TEXT) {
        snprintf(msg, cap, "a forced 'tool_choice' and a JSON or grammar reply format: the "
                           "call is the reply's format, give one of them");
        return -1;
    }
    p->has_format = 1;
    p->format = LLMS__RESPONSE_FORMAT__FORMAT_JSON_SCHEMA;
    p->json_schema = ts->schema;
    return 0;
}

void toolcall_set_free(toolcall_set *ts)
{
    for (size_t i = 0; ts->defs && i < ts->n; i++)
        free(ts->defs[i]);
    free(ts->defs);
    free(ts->names);
    free(ts->params);
    free(ts->schema);
    free(ts->header);
    free(ts->call_open);
    memset(ts, 0, sizeof *ts);
}

/* ---- rendering ---- */

/* What a forced call's reply follows in the scan, and what closes it after: the call's
 * markers with the line breaks the templates put around its JSON (llama3's call is the
 * bare object: none; mistral's is the one item of the array of calls); gpt-oss's reply,
 * the arguments alone, goes between the call's opening and closing as harmony.h writes
 * them. */
static const char *forced_opening(const toolcall_set *ts)
{
    const struct chat_tool_syntax *syn = chat_tool_syntax(ts->family);
    if (ts->family == CHAT_GPT_OSS)
        return ts->call_open;
    return syn->whole ? "" : syn->array ? "[TOOL_CALLS][" : "<tool_call>\n";
}

static const char *forced_closing(const toolcall_set *ts)
{
    const struct chat_tool_syntax *syn = chat_tool_syntax(ts->family);
    if (ts->family == CHAT_GPT_OSS)
        return "}\n</tool_call>";
    return syn->whole ? "" : syn->array ? "]" : "\n</tool_call>";
}

/* What a forced call's reply follows in the prompt: the scan's opening, but gpt-oss's
 * call header. */
static const char *forced_prompt_opening(const toolcall_set *ts)
{
    return ts->family == CHAT_GPT_OSS ? ts->header : forced_opening(ts);
}

/* Mistral's call ids: 9 letters and digits. */
#define CALL_ID_LEN 9
typedef char call_id[CALL_ID_LEN + 1];

/* What a conversation's messages hold beside their JSON: content joined from parts,
 * calls, their arguments' text and ids. */
typedef struct rendering {
    struct chat_tool_message *msgs;
    char **owned;                  /* per message: joined content parts */
    struct chat_tool_call **calls; /* per message */
    char **args;                   /* every call's arguments text */
    call_id *ids;                  /* every call's id, as mistral takes it */
    call_id *result_ids;           /* per message: a result's call id, as mistral takes it */
    const char **reasoning;        /* per message: an assistant's reasoning sent back
                                      ("reasoning_content", ollama's "thinking"), or NULL */
    size_t n_msgs, n_args;
    size_t last_calls;             /* the first call of the last assistant message with calls */
    size_t results;                /* the results since it */
} rendering;

static void rendering_free(rendering *r)
{
    for (size_t i = 0; i < r->n_msgs; i++) {
        free(r->owned[i]);
        free(r->calls[i]);
    }
    for (size_t i = 0; i < r->n_args; i++)
        free(r->args[i]);
    free(r->msgs);
    free(r->owned);
    free(r->calls);
    free(r->args);
    free(r->ids);
    free(r->result_ids);
    free(r->reasoning);
}

static bool is_alnum(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* A call id as Mistral's template takes it: 9 letters and digits. OpenAI's ("call_" and
 * 24 hex digits) and any other id become its last 9 letters and digits, '0's before
 * fewer (vLLM keeps an id's last 9 characters), so that a call and the result naming it
 * still agree; without any (ollama sends no ids) the call's position in the
 * conversation, written in 9 digits. */
static void mistral_call_id(json_object *id, size_t position, call_id out)
{
    const char *s = json_object_is_type(id, json_type_string) ? json_object_get_string(id) : "";
    size_t k = CALL_ID_LEN;
    memset(out, '0', CALL_ID_LEN);
    out[CALL_ID_LEN] = '\0';
    for (size_t i = strlen(s); i > 0 && k > 0; i--)
        if (is_alnum(s[i - 1]))
            out[--k] = s[i - 1];
    if (k == CALL_ID_LEN)
        snprintf(out, CALL_ID_LEN + 1, "%09zu", position % 1000000000);
}

/* A call's arguments: an object, or (OpenAI) a string holding one. Fresh object. */
static json_object *call_arguments(json_object *fn)
{
    json_object *a;
    if (!json_object_object_get_ex(fn, "arguments", &a))
        return NULL;
    if (json_object_is_type(a, json_type_string)) {
        a = json_tokener_parse(json_object_get_string(a));
        if (json_object_is_type(a, json_type_object))
            return a;
        json_object_put(a);
        return NULL;
    }
    return json_object_is_type(a, json_type_object) ? json_object_get(a) : NULL;
}

/* messages[i].tool_calls into r (message i). 0, or -1 with msg. */
static int read_calls(rendering *r, size_t i, json_object *list, char *msg, size_t cap)
{
    size_t n = json_object_array_length(list);
    struct chat_tool_call *calls = calloc(n ? n : 1, sizeof *calls);
    if (!calls) {
        snprintf(msg, cap, "out of memory");
        return -1;
    }
    r->calls[i] = calls;
    r->last_calls = r->n_args;
    r->results = 0;
    for (size_t k = 0; k < n; k++) {
        json_object *c = json_object_array_get_idx(list, k), *fn, *name;
        if (!json_object_is_type(c, json_type_object) ||
            !json_object_object_get_ex(c, "function", &fn) ||
            !json_object_object_get_ex(fn, "name", &name) ||
            !json_object_is_type(name, json_type_string)) {
            snprintf(msg, cap, "messages[%zu].tool_calls[%zu].function.name must be a string", i, k);
            return -1;
        }
        json_object *args = call_arguments(fn);
        if (!args) {
            snprintf(msg, cap, "messages[%zu].tool_calls[%zu].function.arguments must be a JSON "
                               "object (or a string holding one)", i, k);
            return -1;
        }
        char *text = dump_text(args, 0);
        json_object_put(args);
        if (!text) {
            snprintf(msg, cap, "out of memory");
            return -1;
        }
        mistral_call_id(json_object_object_get(c, "id"), r->n_args, r->ids[r->n_args]);
        calls[k] = (struct chat_tool_call){json_object_get_string(name), text, r->ids[r->n_args]};
        r->args[r->n_args++] = text;
    }
    r->msgs[i].calls = calls;
    r->msgs[i].n_calls = (int)n;
    return 0;
}

/* Counts every call of the messages (the room for their arguments). */
static size_t count_calls(json_object *msgs)
{
    size_t total = 0;
    for (size_t i = 0; i < json_object_array_length(msgs); i++) {
        json_object *calls;
        if (json_object_object_get_ex(json_object_array_get_idx(msgs, i), "tool_calls", &calls) &&
            json_object_is_type(calls, json_type_array))
            total += json_object_array_length(calls);
    }
    return total;
}

/* messages[i] into r. 0, or -1 with msg. */
static int read_message(rendering *r, size_t i, json_object *m, char *msg, size_t cap)
{
    json_object *role, *calls;
    if (!json_object_is_type(m, json_type_object) || !json_object_object_get_ex(m, "role", &role) ||
        !json_object_is_type(role, json_type_string)) {
        snprintf(msg, cap, "messages[%zu] needs a 'role' string", i);
        return -1;
    }
    const char *name = json_object_get_string(role);
    if (strcmp(name, "developer") == 0)
        name = "system";
    if (strcmp(name, "system") && strcmp(name, "user") && strcmp(name, "assistant") &&
        strcmp(name, "tool")) {
        snprintf(msg, cap, "messages[%zu]: role '%.32s' is not supported (system, user, "
                           "assistant, tool)", i, name);
        return -1;
    }
    r->msgs[i].role = name;
    if (!(r->msgs[i].content = jsonfield_message_content(m, &r->owned[i], msg, cap)))
        return -1;
    json_object *thought;
    if (strcmp(name, "assistant") == 0 &&
        ((json_object_object_get_ex(m, "reasoning_content", &thought) &&
          json_object_is_type(thought, json_type_string)) ||
         (json_object_object_get_ex(m, "thinking", &thought) &&
          json_object_is_type(thought, json_type_string))))
        r->reasoning[i] = json_object_get_string(thought);
    if (strcmp(name, "tool") == 0) {
        /* without its call's id, a result answers the calls before it in order */
        mistral_call_id(json_object_object_get(m, "tool_call_id"), r->last_calls + r->results++,
                        r->result_ids[i]);
        r->msgs[i].call_id = r->result_ids[i];
    }
    if (!json_object_object_get_ex(m, "tool_calls", &calls) || jsonfield_asks_nothing(calls))
        return 0;
    if (strcmp(name, "assistant") != 0 || !json_object_is_type(calls, json_type_array)) {
        snprintf(msg, cap, "messages[%zu].tool_calls must be an array in an assistant message", i);
        return -1;
    }
    return read_calls(r, i, calls, msg, cap);
}

/* What the family's template asks of a conversation that chat_apply_tools refuses. */
static const char *refusal_reason(enum chat_family f)
{
    if (f == CHAT_LLAMA3)
        return " (one tool call per assistant message, a user message first after the system "
               "one)";
    if (f == CHAT_MISTRAL_V3_TEKKEN)
        return " (after an optional first system message, user and assistant messages "
               "alternate from a user one, tool calls and results aside)";
    if (f == CHAT_GPT_OSS)
        return " (a tool result after an assistant message with a call, and no assistant "
               "message with both text and reasoning besides its call, nor harmony's channel "
               "markup)";
    return "";
}

/* The messages read into r with ts's tools in the family's format (chat_apply_tools, or
 * gpt-oss's with effort and the messages' reasoning), like snprintf. */
static int render_into(const toolcall_set *ts, const rendering *r, const char *date,
                       bool enable_thinking, const char *effort, char *out, size_t cap)
{
    const char *const *defs = (const char *const *)ts->defs;
    if (ts->family == CHAT_GPT_OSS) {
        struct chat_harmony_opts o = {date, effort, r->reasoning};
        return chat_harmony_apply(&o, defs, (int)ts->n, r->msgs, (int)r->n_msgs, true, out, cap);
    }
    return chat_apply_tools(ts->family, defs, (int)ts->n, date, r->msgs, (int)r->n_msgs, true,
                            enable_thinking, out, cap);
}

char *toolcall_render(const toolcall_set *ts, json_object *msgs, const char *date,
                      bool enable_thinking, const char *effort, char *msg, size_t cap)
{
    size_t n = json_object_array_length(msgs), n_calls = count_calls(msgs);
    rendering r = {
        .msgs = calloc(n ? n : 1, sizeof *r.msgs),
        .owned = calloc(n ? n : 1, sizeof *r.owned),
        .calls = calloc(n ? n : 1, sizeof *r.calls),
        .args = calloc(n_calls ? n_calls : 1, sizeof *r.args),
        .ids = calloc(n_calls ? n_calls : 1, sizeof *r.ids),
        .result_ids = calloc(n ? n : 1, sizeof *r.result_ids),
        .reasoning = calloc(n ? n : 1, sizeof *r.reasoning),
        .n_msgs = n,
    };
    char *out = NULL;
    if (!r.msgs || !r.owned || !r.calls || !r.args || !r.ids || !r.result_ids || !r.reasoning) {
        snprintf(msg, cap, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++)
        if (read_message(&r, i, json_object_array_get_idx(msgs, i), msg, cap) < 0)
            goto done;
    int len = render_into(ts, &r, date, enable_thinking, effort, NULL, 0);
    if (len < 0) {
        snprintf(msg, cap, "the messages cannot be rendered with tools in the %s format%s",
                 chat_family_name(ts->family),
                 refusal_reason(ts->family));
        goto done;
    }
    if (!(out = malloc((size_t)len + 1))) {
        snprintf(msg, cap, "out of memory");
        goto done;
    }
    render_into(ts, &r, date, enable_thinking, effort, out, (size_t)len + 1);
    if (ts->forced) {
        const char *opening = forced_prompt_opening(ts);
        char *with = realloc(out, (size_t)len + strlen(opening) + 1);
        if (!with) {
            snprintf(msg, cap, "out of memory");
            free(out);
            out = NULL;
            goto done;
        }
        out = strcat(with, opening);
    }
done:
    if (r.owned && r.calls)
        rendering_free(&r);
    else {
        free(r.msgs);
        free(r.owned);
        free(r.calls);
        free(r.args);
        free(r.ids);
        free(r.result_ids);
        free(r.reasoning);
    }
    return out;
}

/* ---- scanning replies ---- */

struct toolcall_scan {
    const toolcall_set *ts;
    const struct chat_tool_syntax *syn;
    char *text;          /* the reply so far */
    size_t len, cap;
    size_t done;         /* bytes decided: gone out as content or taken by calls */
    size_t n_calls;
    bool after_call;     /* the last thing decided was a call: white space next is dropped */
    bool whole;          /* (syntax whole) the reply began as a call: held to its end */
    size_t primed;       /* bytes of a forced call's opening before the reply's own */
};

toolcall_scan *toolcall_scan_new(const toolcall_set *ts)
{
    toolcall_scan *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->ts = ts;
    s->syn = chat_tool_syntax(ts->family);
    if (ts->forced) {
        const char *opening = forced_opening(ts);
        s->primed = s->len = strlen(opening);
        s->cap = s->len + 1;
        if (!(s->text = strdup(opening))) {
            free(s);
            return NULL;
        }
    }
    return s;
}

void toolcall_scan_free(toolcall_scan *s)
{
    if (s)
        free(s->text);
    free(s);
}

size_t toolcall_scan_fed(const toolcall_scan *s)
{
    return s->len - s->primed;
}

size_t toolcall_scan_calls(const toolcall_scan *s)
{
    return s->n_calls;
}

void toolcall_out_free(toolcall_out *out)
{
    free(out->content);
    json_object_put(out->calls);
    memset(out, 0, sizeof *out);
}

const char *toolcall_arguments_text(json_object *call)
{
    json_object *a = NULL;
    json_object_object_get_ex(call, "arguments", &a);
    return json_object_to_json_string_ext(a, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Appends n bytes to out's content; white space right after a call is dropped. -1 out
 * of memory. */
static int add_content(toolcall_scan *s, toolcall_out *out, const char *p, size_t n)
{
    if (s->after_call)
        while (n > 0 && is_space(*p))
            p++, n--;
    if (n == 0)
        return 0;
    char *c = realloc(out->content, out->content_len + n + 1);
    if (!c)
        return -1;
    memcpy(c + out->content_len, p, n);
    out->content_len += n;
    c[out->content_len] = '\0';
    out->content = c;
    s->after_call = false;
    return 0;
}

/* n bytes of JSON that must be one value and nothing else but white space. */
static json_object *parse_exact(const char *p, size_t n)
{
    json_tokener *tok = json_tokener_new();
    if (!tok)
        return NULL;
    json_object *o = json_tokener_parse_ex(tok, p, (int)n);
    size_t used = (size_t)json_tokener_get_parse_end(tok);
    bool whole = o && json_tokener_get_error(tok) == json_tokener_success;
    json_tokener_free(tok);
    while (whole && used < n && is_space(p[used]))
        used++;
    if (!whole || used != n) {
        json_object_put(o);
        return NULL;
    }
    return o;
}

static bool known_name(const toolcall_set *ts, const char *name)
{
    for (size_t i = 0; i < ts->n; i++)
        if (strcmp(ts->names[i], name) == 0)
            return true;
    return false;
}

/* "call_" and 24 random hex digits, as OpenAI's ids look. */
static json_object *new_call_id(size_t counter)
{
    unsigned char r[12];
    if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r)
        for (size_t i = 0; i < sizeof r; i++)
            r[i] = (unsigned char)((counter + 1) * 0x9e3779b97f4a7c15ull >> (i * 5));
    char id[5 + 2 * sizeof r + 1] = "call_";
    for (size_t i = 0; i < sizeof r; i++)
        snprintf(id + 5 + 2 * i, 3, "%02x", r[i]);
    return json_object_new_string(id);
}

/* The call o is ({"name": known, args_key: object}; other keys, as mistral's "id", are
 * left), or NULL. gpt-oss's calls are of any name: its header's recipient is markup the
 * reply cannot hold as text, and llama.cpp's server reads it as a call of that name. */
static json_object *call_of(toolcall_scan *s, json_object *o, size_t counter)
{
    json_object *name, *args;
    if (!json_object_is_type(o, json_type_object) || !json_object_object_get_ex(o, "name", &name) ||
        !json_object_is_type(name, json_type_string) ||
        !(s->ts->family == CHAT_GPT_OSS || known_name(s->ts, json_object_get_string(name))) ||
        !json_object_object_get_ex(o, s->syn->args_key, &args) ||
        !json_object_is_type(args, json_type_object))
        return NULL;
    json_object *call = json_object_new_object();
    if (call) {
        json_object_object_add(call, "id", new_call_id(counter));
        json_object_object_add(call, "name", json_object_get(name));
        json_object_object_add(call, "arguments", json_object_get(args));
    }
    return call;
}

/* The calls n bytes of JSON hold, as an array of calls: one call (chatml, llama3), or
 * each item of mistral's array, all of them calls (else none is: the text stays). NULL
 * when they are not. */
static json_object *parse_calls(toolcall_scan *s, const char *p, size_t n)
{
    json_object *o = parse_exact(p, n), *calls = json_object_new_array();
    bool ok = o && calls;
    if (ok && s->syn->array) {
        ok = json_object_is_type(o, json_type_array) && json_object_array_length(o) > 0;
        for (size_t i = 0; ok && i < json_object_array_length(o); i++) {
            json_object *call = call_of(s, json_object_array_get_idx(o, i), s->n_calls + i);
            ok = call && json_object_array_add(calls, call) == 0;
            if (!ok)
                json_object_put(call);
        }
    } else if (ok) {
        json_object *call = call_of(s, o, s->n_calls);
        ok = call && json_object_array_add(calls, call) == 0;
        if (!ok)
            json_object_put(call);
    }
    json_object_put(o);
    if (!ok) {
        json_object_put(calls);
        return NULL;
    }
    return calls;
}

/* Keeps the calls found in the reply (taking them), dropping those after the first when
 * parallel_tool_calls is false. -1 out of memory. */
static int keep_calls(toolcall_scan *s, toolcall_out *out, json_object *calls)
{
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < json_object_array_length(calls); i++) {
        if (s->ts->first_only && s->n_calls > 0)
            break;
        json_object *call = json_object_get(json_object_array_get_idx(calls, i));
        if (json_object_array_add(out->calls, call) < 0) {
            json_object_put(call);
            rc = -1;
        } else {
            s->n_calls++;
        }
    }
    json_object_put(calls);
    s->after_call = true;
    return rc;
}

/* The bytes at the end of p[0..n) that may begin open (a part of it, and the white space
 * before, which goes with the call when one follows). */
static size_t held_tail(const char *p, size_t n, const char *open)
{
    size_t ol = strlen(open), keep = 0;
    for (size_t k = ol - 1; k > 0; k--)
        if (k <= n && memcmp(p + n - k, open, k) == 0) {
            keep = k;
            break;
        }
    while (keep < n && is_space(p[n - keep - 1]))
        keep++;
    return keep;
}

static const char *find_n(const char *hay, size_t n, const char *needle)
{
    return memmem(hay, n, needle, strlen(needle));
}

/* Where the calls' text that starts at body ends: chatml's close marker (*stop after
 * it) or the end of mistral's JSON array (*stop there too). 1 found; 0 while there is
 * none: not yet, or (array) no JSON array there at all, which the reply's end makes
 * text; -1 out of memory. */
static int calls_end(const toolcall_scan *s, size_t body, size_t *body_end, size_t *stop)
{
    if (!s->syn->array) {
        const char *c = find_n(s->text + body, s->len - body, s->syn->close);
        if (!c)
            return 0;
        *body_end = (size_t)(c - s->text);
        *stop = *body_end + strlen(s->syn->close);
        return 1;
    }
    json_tokener *tok = json_tokener_new();
    if (!tok)
        return -1;
    json_object *o = json_tokener_parse_ex(tok, s->text + body, (int)(s->len - body));
    bool done = json_object_is_type(o, json_type_array);
    *body_end = *stop = body + (size_t)json_tokener_get_parse_end(tok);
    json_object_put(o);
    json_tokener_free(tok);
    return done;
}

/* A gpt-oss call that is no call (its arguments no JSON object), p[0..n) between the
 * markers as daemon/net/harmony.h wrote it, {"name": "NAME", "arguments": BODY}: BODY,
 * in p[*from..*from + *len), the content it is, as with tool_choice "none". */
static void harmony_body(const char *p, size_t n, size_t *from, size_t *len)
{
    static const char key[] = "\"arguments\": ";
    const char *a = memmem(p, n, key, strlen(key));
    size_t at = a ? (size_t)(a - p) + strlen(key) : n, end = n;
    /* the wrapper's own closing brace, after the body */
    while (end > at && p[end - 1] != '}')
        end--;
    *from = at;
    *len = end > at ? end - 1 - at : 0;
}

/* The reply between markers (chatml), or after one (mistral's array): calls taken as
 * they close. */
static int scan_marked(toolcall_scan *s, toolcall_out *out, bool end)
{
    const char *open = s->syn->open;
    for (;;) {
        const char *rest = s->text + s->done;
        size_t rl = s->len - s->done;
        const char *o = find_n(rest, rl, open);
        if (!o) {
            size_t hold = end ? 0 : held_tail(rest, rl, open);
            if (add_content(s, out, rest, rl - hold) < 0)
                return -1;
            s->done += rl - hold;
            return 0;
        }
        size_t at = (size_t)(o - rest), body = s->done + at + strlen(open), body_end, stop;
        int found = calls_end(s, body, &body_end, &stop);
        if (found < 0)
            return -1;
        if (!found) {
            /* a call not closed yet, or (at the end) never: its text is content */
            size_t upto = end ? rl : at;
            size_t pre = upto;
            if (!end)
                while (pre > 0 && is_space(rest[pre - 1]))
                    pre--;
            if (add_content(s, out, rest, pre) < 0)
                return -1;
            s->done += pre;
            return 0;
        }
        json_object *calls = parse_calls(s, s->text + body, body_end - body);
        /* white space before a call goes with it; a call that does not parse is text, but
         * gpt-oss's, whose markers are the gateway's own: its body alone */
        bool bare = !calls && s->ts->family == CHAT_GPT_OSS;
        size_t pre = calls || bare ? at : stop - s->done, from, len;
        while (calls && pre > 0 && is_space(rest[pre - 1]))
            pre--;
        if (bare)
            harmony_body(s->text + body, body_end - body, &from, &len);
        if (add_content(s, out, rest, pre) < 0 ||
            (bare && add_content(s, out, s->text + body + from, len) < 0)) {
            json_object_put(calls);
            return -1;
        }
        if (calls && keep_calls(s, out, calls) < 0)
            return -1;
        s->done = stop;
    }
}

/* A reply that is one call (llama3): held from its first "{" to its end. */
static int scan_whole(toolcall_scan *s, toolcall_out *out, bool end)
{
    if (s->done == 0 && !s->whole) {
        size_t i = 0;
        while (i < s->len && is_space(s->text[i]))
            i++;
        if (i == s->len && !end)
            return 0;
        s->whole = i < s->len && s->text[i] == s->syn->open[0];
        if (!s->whole) {
            s->done = s->len;
            return add_content(s, out, s->text, s->len);
        }
    }
    if (!s->whole) {
        size_t from = s->done;
        s->done = s->len;
        return add_content(s, out, s->text + from, s->len - from);
    }
    if (!end)
        return 0;
    s->done = s->len;
    json_object *calls = parse_calls(s, s->text, s->len);
    return calls ? keep_calls(s, out, calls) : add_content(s, out, s->text, s->len);
}

/* The reply of a forced call is over: its closing follows, so that the call is read as
 * the family writes it (not counted as fed). */
static int append_closing(toolcall_scan *s)
{
    const char *closing = forced_closing(s->ts);
    size_t k = strlen(closing);
    if (s->len + k + 1 > s->cap) {
        char *t = realloc(s->text, s->len + k + 1);
        if (!t)
            return -1;
        s->text = t;
        s->cap = s->len + k + 1;
    }
    memcpy(s->text + s->len, closing, k + 1);
    s->len += k;
    s->primed += k;
    return 0;
}

/* A forced call that did not parse (cut short by max_tokens) comes out as the reply's
 * own text: without the opening the prompt ended with and the closing put after it. */
static void strip_forced_markers(const toolcall_scan *s, toolcall_out *out)
{
    const char *open = forced_opening(s->ts), *close = forced_closing(s->ts);
    size_t no = strlen(open), nc = strlen(close);
    if (!out->content)
        return;
    if (out->content_len >= no && memcmp(out->content, open, no) == 0) {
        memmove(out->content, out->content + no, out->content_len - no);
        out->content_len -= no;
    }
    if (out->content_len >= nc && memcmp(out->content + out->content_len - nc, close, nc) == 0)
        out->content_len -= nc;
    out->content[out->content_len] = '\0';
}

int toolcall_scan_feed(toolcall_scan *s, const char *text, size_t n, bool end, toolcall_out *out)
{
    memset(out, 0, sizeof *out);
    if (!(out->calls = json_object_new_array()))
        return -1;
    if (s->len + n + 1 > s->cap) {
        size_t cap = 2 * (s->len + n + 1);
        char *t = realloc(s->text, cap);
        if (!t)
            return -1;
        s->text = t;
        s->cap = cap;
    }
    memcpy(s->text + s->len, text, n);
    s->len += n;
    s->text[s->len] = '\0';
    bool forced_end = end && s->ts->forced;
    if (forced_end && append_closing(s) < 0)
        return -1;
    int rc = s->syn->whole ? scan_whole(s, out, end) : scan_marked(s, out, end);
    if (rc == 0 && forced_end)
        strip_forced_markers(s, out);
    return rc;
}
