/*
 * toolcall.h — tool calling on the gateway, for both API shapes: a request's "tools",
 * "tool_choice" and "parallel_tool_calls" read, the conversation with its tools and
 * tool messages rendered in the model's chat family (engine/tok/chattools.h, which the
 * JSON written here feeds: each tool as the template writes it, tojson or Mistral Nemo's
 * and Hermes' own loops over its fields), and replies scanned for calls in the family's
 * syntax, whole or piece by piece as they stream.
 * A call that does not parse (bad JSON, an unknown function, no arguments object) stays
 * text of the reply, as llama.cpp leaves it.
 */
#ifndef LLMS_TOOLCALL_H
#define LLMS_TOOLCALL_H

#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>

#include "engine/tok/chattools.h"
#include "proto/llms.pb-c.h"

/* A request's tools. */
typedef struct toolcall_set {
    enum chat_family family;
    char **defs;          /* n tool definitions as the family's template writes them */
    const char **names;   /* n function names (pointing into the request body) */
    size_t n;
    json_object **params; /* n parameter schemas (into the request body), NULL for none */
    bool parse;           /* tool_choice "auto", "required" or a function: replies are
                             read for calls */
    bool first_only;      /* parallel_tool_calls false: a reply's first call alone */
    bool forced;          /* tool_choice "required" or a function: the reply is one call */
    int forced_fn;        /* with forced: the index of the function named, or
                             TOOLCALL_ANY_FN ("required") */
    char *schema;         /* forced: the JSON Schema of the call's object, which the reply
                             is decoded against (FORMAT_JSON_SCHEMA); gpt-oss's: of the
                             function's arguments */
    char *header;         /* forced gpt-oss: the call's header the prompt ends with */
    char *call_open;      /* forced gpt-oss: the call's opening in chatml's syntax, which
                             the scan reads before the reply (daemon/net/harmony.h's) */
} toolcall_set;

/* toolcall_set.forced_fn of tool_choice "required": any of the functions. */
#define TOOLCALL_ANY_FN (-1)

/*
 * Reads body's "tools" ([{"type": "function", "function": {"name", "description"?,
 * "parameters"?}}], OpenAI's and ollama's shape), "tool_choice" and
 * "parallel_tool_calls" for a model of family f into ts. 0 with ts->n == 0 when there
 * are none (absent, null or empty); 0 with them read; -1 with msg naming the field for a
 * malformed tool (for hermes also properties that are no object and a property's or
 * return's description that is no string, which its template cannot write), a family
 * without a tool format, a tool_choice naming no tool, or "required" for gpt-oss (its
 * call of any function is a header the reply writes, which a JSON Schema cannot
 * constrain; a named one is the header the prompt ends with, the reply the arguments).
 * toolcall_set_free frees what it holds either way.
 *
 * A forced tool_choice ("required", or {"type": "function", "function": {"name"}}) gets
 * ts->schema: the call's object in the family's syntax ({"name", "arguments"} or llama3's
 * "parameters"), its name one of the functions (or the one named), its arguments of that
 * function's parameters schema (with "required" among several, one of their calls: the
 * name, written first, chooses). The reply decoded against it is one call: the rendered
 * prompt ends with the call's opening.
 */
int toolcall_read(json_object *body, enum chat_family f, toolcall_set *ts, char *msg, size_t cap);
void toolcall_set_free(toolcall_set *ts);

/* A forced call's reply is decoded against ts->schema: sets p's format to it (p is the
 * request's, read before; its strings then point into ts). Nothing for a free choice.
 * 0, or -1 with msg when the request asks for another format too. */
int toolcall_constrain(const toolcall_set *ts, Llms__GenerationParams *p, char *msg, size_t cap);

/* The messages (OpenAI's or ollama's: role system/developer, user, assistant with
 * "tool_calls", tool) rendered with ts's tools (a set toolcall_read filled without
 * error) and the assistant opening (with a forced tool_choice, the call's opening too:
 * chatml's "<tool_call>\n", mistral's "[TOOL_CALLS]["); date is llama3's "Today Date"
 * (gpt-oss's "Current date",
 * YYYY-MM-DD), enable_thinking the template's switch (chat_apply_think), effort
 * gpt-oss's reasoning effort (NULL: medium; engine/tok/chatharmony.h, which also gets an
 * assistant message's "reasoning_content" or ollama's "thinking"). Call ids become mistral's 9 letters
 * and digits: an id's last 9, '0's before fewer; without one, the call's position in the
 * conversation (a result without one answers the calls before it in order). Fresh
 * string, or NULL with msg. */
char *toolcall_render(const toolcall_set *ts, json_object *msgs, const char *date,
                      bool enable_thinking, const char *effort, char *msg, size_t cap);

/* A reply being scanned for calls. */
typedef struct toolcall_scan toolcall_scan;

/* What a piece of reply gives: text that can go out as content now (fresh, may be
 * empty), and the calls found in it (each {"id", "name", "arguments": object}, taken
 * by the caller; an empty array when none). */
typedef struct toolcall_out {
    char *content;
    size_t content_len;
    json_object *calls;
} toolcall_out;

/* A scan of a reply against ts, whose parse is set (ts is kept by the caller while the
 * scan lives); NULL out of memory. With a forced tool_choice the reply is read as the
 * call's body: the opening the prompt ended with comes before it, the closing after. */
toolcall_scan *toolcall_scan_new(const toolcall_set *ts);
void toolcall_scan_free(toolcall_scan *s);

/* Bytes of reply fed so far. */
size_t toolcall_scan_fed(const toolcall_scan *s);

/* Calls found so far. */
size_t toolcall_scan_calls(const toolcall_scan *s);

/* Feeds n more bytes of the reply (end: the reply is over: what was held back as a
 * possible call is decided, a call without its end being text) and fills out (free its
 * parts with toolcall_out_free). Text that may begin a call is held back until it is
 * decided. 0, or -1 out of memory. */
int toolcall_scan_feed(toolcall_scan *s, const char *text, size_t n, bool end, toolcall_out *out);
void toolcall_out_free(toolcall_out *out);

/* A call's arguments as OpenAI's JSON string. Owned by call. */
const char *toolcall_arguments_text(json_object *call);

#endif
