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

#include "daemon/net/jsonfield.h"

/* ---- JSON as the templates' tojson writes it ---- */

/* A string as Python's json.dumps(ensure_ascii=False) writes it. */
static void dump_string(struct printbuf *pb, const char *s, size_t n)
{
    printbuf_memappend(pb, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        printbuf_memappend(pb, s + run, (int)(i - run));
        char esc[8];
        switch (c) {
        case '"': strcpy(esc, "\\\""); break;
        case '\\': strcpy(esc, "\\\\"); break;
        case '\n': strcpy(esc, "\\n"); break;
        case '\r': strcpy(esc, "\\r"); break;
        case '\t': strcpy(esc, "\\t"); break;
        case '\b': strcpy(esc, "\\b"); break;
        case '\f': strcpy(esc, "\\f"); break;
        default: snprintf(esc, sizeof esc, "\\u%04x", c); break;
        }
        printbuf_memappend(pb, esc, (int)strlen(esc));
        run = i + 1;
    }
    printbuf_memappend(pb, s + run, (int)(n - run));
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

/* ---- reading tools ---- */

/* tool_choice values that force a call need the arguments decoded against the
 * function's schema, which decoding cannot do yet: refused, here alone. */
static int refuse_forced_choice(json_object *choice, char *msg, size_t cap)
{
    if (json_object_is_type(choice, json_type_object)) {
        snprintf(msg, cap, "'tool_choice' naming a function is not supported yet (it needs "
                           "schema-constrained decoding)");
        return -1;
    }
    snprintf(msg, cap, "tool_choice 'required' is not supported yet (it needs "
                       "schema-constrained decoding)");
    return -1;
}

/* "tool_choice" into ts->parse: "auto" (the default) reads replies for calls; "none"
 * keeps the tools in the prompt, as llama.cpp does, and leaves the reply text. */
static int read_choice(json_object *body, toolcall_set *ts, char *msg, size_t cap)
{
    json_object *v;
    ts->parse = true;
    if (!json_object_object_get_ex(body, "tool_choice", &v) || json_object_is_type(v, json_type_null))
        return 0;
    const char *s = json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
    if (s && strcmp(s, "auto") == 0)
        return 0;
    if (s && strcmp(s, "none") == 0) {
        ts->parse = false;
        return 0;
    }
    if ((s && strcmp(s, "required") == 0) || json_object_is_type(v, json_type_object))
        return refuse_forced_choice(v, msg, cap);
    snprintf(msg, cap, "'tool_choice' must be \"auto\", \"none\", \"required\" or a function");
    return -1;
}

/* tools[i]: {"type": "function", "function": {"name", "description"?, "parameters"?}};
 * its name in *name. 0, or -1 with msg naming the field. */
static int check_tool(json_object *t, size_t i, const char **name, char *msg, size_t cap)
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
    memset(ts, 0, sizeof *ts);
    ts->family = f;
    if (read_choice(body, ts, msg, cap) < 0)
        return -1;
    int rc = jsonfield_get(body, "parallel_tool_calls", "", json_type_boolean, &v, msg, cap);
    if (rc < 0)
        return -1;
    ts->first_only = rc == 1 && !json_object_get_boolean(v);
    if ((rc = jsonfield_get(body, "tools", "", json_type_array, &tools, msg, cap)) <= 0)
        return rc;
    size_t n = json_object_array_length(tools);
    if (n == 0)
        return 0;
    if (!chat_tool_syntax(f)) {
        snprintf(msg, cap, "'tools': the model's chat template (%s) has no tool format (tools "
                           "are supported with chatml and llama3 templates)", chat_family_name(f));
        return -1;
    }
    ts->defs = calloc(n, sizeof *ts->defs);
    ts->names = calloc(n, sizeof *ts->names);
    if (!ts->defs || !ts->names) {
        snprintf(msg, cap, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        json_object *t = json_object_array_get_idx(tools, i);
        if (check_tool(t, i, &ts->names[i], msg, cap) < 0)
            return -1;
        if (!(ts->defs[i] = dump_text(t, chat_tools_indent(f)))) {
            snprintf(msg, cap, "out of memory");
            return -1;
        }
        ts->n = i + 1;
    }
    return 0;
}

void toolcall_set_free(toolcall_set *ts)
{
    for (size_t i = 0; ts->defs && i < ts->n; i++)
        free(ts->defs[i]);
    free(ts->defs);
    free(ts->names);
    memset(ts, 0, sizeof *ts);
}

/* ---- rendering ---- */

/* What a conversation's messages hold beside their JSON: content joined from parts,
 * calls and their arguments' text. */
typedef struct rendering {
    struct chat_tool_message *msgs;
    char **owned;                  /* per message: joined content parts */
    struct chat_tool_call **calls; /* per message */
    char **args;                   /* every call's arguments text */
    size_t n_msgs, n_args;
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
        r->args[r->n_args++] = text;
        calls[k] = (struct chat_tool_call){json_object_get_string(name), text};
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
    if (!json_object_object_get_ex(m, "tool_calls", &calls) || jsonfield_asks_nothing(calls))
        return 0;
    if (strcmp(name, "assistant") != 0 || !json_object_is_type(calls, json_type_array)) {
        snprintf(msg, cap, "messages[%zu].tool_calls must be an array in an assistant message", i);
        return -1;
    }
    return read_calls(r, i, calls, msg, cap);
}

char *toolcall_render(const toolcall_set *ts, json_object *msgs, const char *date, char *msg,
                      size_t cap)
{
    size_t n = json_object_array_length(msgs), n_calls = count_calls(msgs);
    rendering r = {
        .msgs = calloc(n ? n : 1, sizeof *r.msgs),
        .owned = calloc(n ? n : 1, sizeof *r.owned),
        .calls = calloc(n ? n : 1, sizeof *r.calls),
        .args = calloc(n_calls ? n_calls : 1, sizeof *r.args),
        .n_msgs = n,
    };
    char *out = NULL;
    if (!r.msgs || !r.owned || !r.calls || !r.args) {
        snprintf(msg, cap, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++)
        if (read_message(&r, i, json_object_array_get_idx(msgs, i), msg, cap) < 0)
            goto done;
    const char *const *defs = (const char *const *)ts->defs;
    int len = chat_apply_tools(ts->family, defs, (int)ts->n, date, r.msgs, (int)n, true, NULL, 0);
    if (len < 0) {
        snprintf(msg, cap, "the messages cannot be rendered with tools in the %s format%s",
                 chat_family_name(ts->family),
                 ts->family == CHAT_LLAMA3 ? " (one tool call per assistant message, a user "
                                             "message first after the system one)" : "");
        goto done;
    }
    if (!(out = malloc((size_t)len + 1))) {
        snprintf(msg, cap, "out of memory");
        goto done;
    }
    chat_apply_tools(ts->family, defs, (int)ts->n, date, r.msgs, (int)n, true, out, (size_t)len + 1);
done:
    if (r.owned && r.calls)
        rendering_free(&r);
    else {
        free(r.msgs);
        free(r.owned);
        free(r.calls);
        free(r.args);
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
};

toolcall_scan *toolcall_scan_new(const toolcall_set *ts)
{
    toolcall_scan *s = calloc(1, sizeof *s);
    if (s) {
        s->ts = ts;
        s->syn = chat_tool_syntax(ts->family);
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
    return s->len;
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

/* The call n bytes of JSON hold ({"name": known, args_key: object}), or NULL. */
static json_object *parse_call(toolcall_scan *s, const char *p, size_t n)
{
    json_object *o = parse_exact(p, n), *name, *args;
    if (!json_object_is_type(o, json_type_object) || !json_object_object_get_ex(o, "name", &name) ||
        !json_object_is_type(name, json_type_string) ||
        !known_name(s->ts, json_object_get_string(name)) ||
        !json_object_object_get_ex(o, s->syn->args_key, &args) ||
        !json_object_is_type(args, json_type_object)) {
        json_object_put(o);
        return NULL;
    }
    json_object *call = json_object_new_object();
    if (call) {
        json_object_object_add(call, "id", new_call_id(s->n_calls));
        json_object_object_add(call, "name", json_object_get(name));
        json_object_object_add(call, "arguments", json_object_get(args));
    }
    json_object_put(o);
    return call;
}

/* Keeps call (found in the reply; NULL: none), dropping those after the first when
 * parallel_tool_calls is false. -1 out of memory. */
static int keep_call(toolcall_scan *s, toolcall_out *out, json_object *call)
{
    if (s->ts->first_only && s->n_calls > 0) {
        json_object_put(call);
    } else if (json_object_array_add(out->calls, call) < 0) {
        json_object_put(call);
        return -1;
    } else {
        s->n_calls++;
    }
    s->after_call = true;
    return 0;
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

/* The reply between markers (chatml): calls taken as they close. */
static int scan_marked(toolcall_scan *s, toolcall_out *out, bool end)
{
    const char *open = s->syn->open, *close = s->syn->close;
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
        size_t at = (size_t)(o - rest), body = s->done + at + strlen(open);
        const char *c = find_n(s->text + body, s->len - body, close);
        if (!c) {
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
        size_t body_end = (size_t)(c - s->text), stop = body_end + strlen(close);
        json_object *call = parse_call(s, s->text + body, body_end - body);
        /* white space before a call goes with it; a call that does not parse is text */
        size_t pre = call ? at : stop - s->done;
        while (call && pre > 0 && is_space(rest[pre - 1]))
            pre--;
        if (add_content(s, out, rest, pre) < 0) {
            json_object_put(call);
            return -1;
        }
        if (call && keep_call(s, out, call) < 0)
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
    json_object *call = parse_call(s, s->text, s->len);
    return call ? keep_call(s, out, call) : add_content(s, out, s->text, s->len);
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
    return s->syn->whole ? scan_whole(s, out, end) : scan_marked(s, out, end);
}
