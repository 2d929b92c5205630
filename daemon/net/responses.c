/*
 * responses.c — OpenAI's Responses API (POST /v1/responses) on the chat route's machinery:
 * a request body is turned into the chat completion it asks for (responses_chat_body),
 * which openai.c reads and runs as /v1/chat/completions runs it (template, sampling,
 * tools, formats, prompt cache); the reply comes back as a response object with output
 * items, or as the Responses' named Server-Sent Events. A response is stored
 * (respstore.h, and through the worker in the store) unless the body says store false,
 * whether it completed, is incomplete (cut short, or a stream whose client left) or
 * failed once its stream began: previous_response_id continues its conversation, and
 * GET, DELETE and input_items read it. What refers to a conversation, an item reference
 * or a background run is refused.
 */
#include <json-c/json.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/net/http_internal.h"
#include "daemon/net/jsonfield.h"
#include "daemon/reqlog.h"
#include "daemon/sched/sched.h"
#include "proto/frame.h"

/* A request's own state: the body as sent, and what its stream has sent. */
struct responses_req {
    json_object *request;  /* the Responses body (hr->body holds the chat made of it) */
    uint64_t seq;          /* the next event's sequence_number */
    json_object *output;   /* the output items streamed so far, in their order */
    int msg_index;         /* the message item's place in output; -1 before its first text */
    struct evbuffer *text; /* the message item's text streamed so far */
    int rs_index;          /* the reasoning item's place in output; -1 before its first text */
    bool rs_done;          /* the reasoning item is done */
    struct evbuffer *reasoning; /* its text streamed so far */
    bool store;            /* the response is stored once it ends */
    const char *previous;  /* the body's previous_response_id (in request), or NULL */
    json_object *items;    /* (store) the input items stored with it: the previous
                              response's, then this body's input, each with an id */
};

void responses_req_free(struct responses_req *rs)
{
    if (!rs)
        return;
    json_object_put(rs->request);
    json_object_put(rs->output);
    json_object_put(rs->items);
    if (rs->text)
        evbuffer_free(rs->text);
    if (rs->reasoning)
        evbuffer_free(rs->reasoning);
    free(rs);
}

/* ---- the request as a chat ---- */

/* Fields of the body the chat route takes under the same names: OpenAI's sampling fields,
 * and the chat's own (seed, top_k, llama.cpp's samplers, ...) as llama.cpp's and vLLM's
 * Responses take them. */
static const char *const chat_fields[] = {
    "temperature", "top_p", "stream", "parallel_tool_calls", "seed", "top_k", "min_p",
    "repeat_penalty", "frequency_penalty", "presence_penalty", "stop", "logit_bias",
    "ignore_eos", "speculation", "chat_template_kwargs", "reasoning_format", "min_keep",
    "typical_p", "top_n_sigma", "xtc_probability", "xtc_threshold", "dynatemp_range",
    "dynatemp_exponent", "dry_multiplier", "dry_base", "dry_allowed_length",
    "dry_penalty_last_n", "dry_sequence_breakers", "mirostat", "mirostat_tau", "mirostat_eta",
    "samplers",
};

/* The member key of o when it is there and not null (JSON's null asks for nothing, as for
 * every field of the gateway), else NULL. */
static json_object *given(json_object *o, const char *key)
{
    json_object *v;
    return json_object_object_get_ex(o, key, &v) ? v : NULL;
}

/* A string member of o that must be there: its text, or NULL. */
static const char *string_member(json_object *o, const char *key)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string))
        return NULL;
    return json_object_get_string(v);
}

/* Content parts of input[i] (content, or a function_call_output's output: where) as the
 * chat's text parts, into *out (fresh). 0, or -1 with msg: a part that is no text (an
 * image, a file, audio) cannot be given to the model. */
static int text_parts(json_object *parts, size_t i, const char *where, json_object **out,
                      char *msg, size_t cap)
{
    size_t n = json_object_array_length(parts);
    *out = json_object_new_array_ext((int)n);
    for (size_t k = 0; *out && k < n; k++) {
        json_object *part = json_object_array_get_idx(parts, k), *text;
        const char *type = json_object_is_type(part, json_type_object)
                               ? string_member(part, "type") : NULL;
        if (!type) {
            snprintf(msg, cap, "input[%zu].%s[%zu] must be an object with a 'type'", i, where, k);
            goto bad;
        }
        if (strcmp(type, "input_text") && strcmp(type, "output_text")) {
            bool media = !strcmp(type, "input_image") || !strcmp(type, "input_file") ||
                         !strcmp(type, "input_audio");
            snprintf(msg, cap, "input[%zu].%s[%zu]: %.32s parts are not supported (%s)", i, where,
                     k, type, media ? "the models served read text only" :
                                      "input_text and output_text are");
            goto bad;
        }
        if (!json_object_object_get_ex(part, "text", &text) ||
            !json_object_is_type(text, json_type_string)) {
            snprintf(msg, cap, "input[%zu].%s[%zu].text must be a string", i, where, k);
            goto bad;
        }
        json_object *p = json_object_new_object();
        if (!p || json_object_array_add(*out, p)) {
            json_object_put(p);
            json_object_put(*out);
            *out = NULL;
            return -2;
        }
        json_object_object_add(p, "type", json_object_new_string("text"));
        json_object_object_add(p, "text", json_object_get(text));
    }
    return *out ? 0 : -2;
bad:
    json_object_put(*out);
    *out = NULL;
    return -1;
}

/* A message's content (or a call output's): a string as it is, parts as the chat's. */
static int chat_content(json_object *c, size_t i, const char *where, json_object **out,
                        char *msg, size_t cap)
{
    if (json_object_is_type(c, json_type_string)) {
        *out = json_object_get(c);
        return 0;
    }
    if (json_object_is_type(c, json_type_array))
        return text_parts(c, i, where, out, msg, cap);
    snprintf(msg, cap, "input[%zu].%s must be a string or an array of parts", i, where);
    return -1;
}

/* A message item (type "message", or none: OpenAI's easy input message). */
static int add_message(json_object *msgs, json_object *item, size_t i, char *msg, size_t cap)
{
    json_object *content;
    const char *role = string_member(item, "role");
    if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") &&
                  strcmp(role, "developer"))) {
        snprintf(msg, cap, "input[%zu].role must be \"user\", \"assistant\", \"system\" or "
                           "\"developer\"", i);
        return -1;
    }
    if (!json_object_object_get_ex(item, "content", &content)) {
        snprintf(msg, cap, "input[%zu].content is required", i);
        return -1;
    }
    json_object *m = json_object_new_object(), *c;
    int rc = m ? chat_content(content, i, "content", &c, msg, cap) : -2;
    if (rc) {
        json_object_put(m);
        return rc;
    }
    json_object_object_add(m, "role", json_object_new_string(role));
    json_object_object_add(m, "content", c);
    return json_object_array_add(msgs, m) ? -2 : 0;
}

/* A function_call item: a call of the assistant message before it (the text and calls of
 * one turn are one chat message), or of a message of its own. */
static int add_call(json_object *msgs, json_object *item, size_t i, char *msg, size_t cap)
{
    const char *id = string_member(item, "call_id"), *name = string_member(item, "name");
    const char *args = string_member(item, "arguments");
    if (!id || !id[0] || !name || !name[0]) {
        snprintf(msg, cap, "input[%zu]: a function_call item needs 'call_id' and 'name' strings",
                 i);
        return -1;
    }
    json_object *parsed = args ? json_tokener_parse(args) : NULL;
    bool object = json_object_is_type(parsed, json_type_object);
    json_object_put(parsed);
    if (!object) {
        snprintf(msg, cap, "input[%zu].arguments must be a string holding a JSON object", i);
        return -1;
    }
    size_t n = json_object_array_length(msgs);
    json_object *last = n ? json_object_array_get_idx(msgs, n - 1) : NULL, *calls;
    const char *role = last ? string_member(last, "role") : NULL;
    if (!role || strcmp(role, "assistant")) {
        if (!(last = json_object_new_object()) || json_object_array_add(msgs, last)) {
            json_object_put(last);
            return -2;
        }
        json_object_object_add(last, "role", json_object_new_string("assistant"));
        json_object_object_add(last, "content", NULL);
    }
    if (!json_object_object_get_ex(last, "tool_calls", &calls)) {
        if (!(calls = json_object_new_array()))
            return -2;
        json_object_object_add(last, "tool_calls", calls);
    }
    json_object *call = json_object_new_object(), *fn = json_object_new_object();
    if (!call || !fn || json_object_array_add(calls, call)) {
        json_object_put(call);
        json_object_put(fn);
        return -2;
    }
    json_object_object_add(call, "id", json_object_new_string(id));
    json_object_object_add(call, "type", json_object_new_string("function"));
    json_object_object_add(fn, "name", json_object_new_string(name));
    json_object_object_add(fn, "arguments", json_object_new_string(args));
    json_object_object_add(call, "function", fn);
    return 0;
}

/* A function_call_output item: the chat's tool message. */
static int add_call_output(json_object *msgs, json_object *item, size_t i, char *msg, size_t cap)
{
    const char *id = string_member(item, "call_id");
    json_object *output, *c;
    if (!id || !id[0] || !json_object_object_get_ex(item, "output", &output)) {
        snprintf(msg, cap, "input[%zu]: a function_call_output item needs 'call_id' and "
                           "'output'", i);
        return -1;
    }
    json_object *m = json_object_new_object();
    int rc = m ? chat_content(output, i, "output", &c, msg, cap) : -2;
    if (rc) {
        json_object_put(m);
        return rc;
    }
    json_object_object_add(m, "role", json_object_new_string("tool"));
    json_object_object_add(m, "tool_call_id", json_object_new_string(id));
    json_object_object_add(m, "content", c);
    return json_object_array_add(msgs, m) ? -2 : 0;
}

/* items (input items, already checked to be an array) as the chat's messages, appended
 * to msgs. tools: whether the body has any, which the template needs to write calls and
 * their results. */
static int read_items(json_object *msgs, json_object *items, bool tools, char *msg, size_t cap)
{
    for (size_t i = 0; i < json_object_array_length(items); i++) {
        json_object *item = json_object_array_get_idx(items, i);
        int rc;
        if (!json_object_is_type(item, json_type_object)) {
            snprintf(msg, cap, "input[%zu] must be an object (a message or a function call item)",
                     i);
            return -1;
        }
        /* OpenAI's easy input message has no type */
        const char *type = given(item, "type") ? string_member(item, "type") : "message";
        if (!type) {
            snprintf(msg, cap, "input[%zu].type must be a string", i);
            return -1;
        }
        bool call = !strcmp(type, "function_call"), output = !strcmp(type, "function_call_output");
        /* an earlier reply's reasoning, sent back as clients keep a conversation: the
         * thinking models' templates leave it out of the history */
        if (!strcmp(type, "reasoning"))
            continue;
        if (!strcmp(type, "message"))
            rc = add_message(msgs, item, i, msg, cap);
        else if (call)
            rc = add_call(msgs, item, i, msg, cap);
        else if (output)
            rc = add_call_output(msgs, item, i, msg, cap);
        else if (!strcmp(type, "item_reference"))
            rc = -1, snprintf(msg, cap, "input[%zu]: item_reference is not supported: send the "
                                        "item itself, or continue a stored response with "
                                        "previous_response_id", i);
        else
            rc = -1, snprintf(msg, cap, "input[%zu]: items of type '%.32s' are not supported "
                                        "(message, function_call, function_call_output, "
                                        "reasoning)", i, type);
        if (rc)
            return rc;
        if ((call || output) && !tools) {
            snprintf(msg, cap, "input[%zu]: a %s item needs the request's 'tools' (the chat "
                               "template writes calls and their results with them)", i, type);
            return -1;
        }
    }
    return 0;
}

/* "instructions", then prior's items (a stored conversation's, or NULL) and "input" as
 * the chat's messages, into chat. tools: whether the body has any. */
static int read_input(json_object *req, json_object *prior, json_object *chat, bool tools,
                      char *msg, size_t cap)
{
    json_object *in, *v;
    int rc = jsonfield_get(req, "instructions", "", json_type_string, &v, msg, cap);
    if (rc < 0)
        return -1;
    json_object *msgs = json_object_new_array();
    if (!msgs)
        return -2;
    json_object_object_add(chat, "messages", msgs);
    /* the system (or developer) message first, as OpenAI puts it */
    if (rc) {
        json_object *m = json_object_new_object();
        if (!m || json_object_array_add(msgs, m)) {
            json_object_put(m);
            return -2;
        }
        json_object_object_add(m, "role", json_object_new_string("system"));
        json_object_object_add(m, "content", json_object_get(v));
    }
    if (prior && (rc = read_items(msgs, prior, tools, msg, cap))) {
        /* the stored items passed once: what fails now is what this request lacks */
        char why[256];
        snprintf(why, sizeof why, "%s", msg);
        snprintf(msg, cap, "the previous response's conversation: %s", why);
        return rc;
    }
    if (!(in = given(req, "input"))) {
        snprintf(msg, cap, "'input' is required (a string, or an array of items)");
        return -1;
    }
    if (json_object_is_type(in, json_type_string)) {
        json_object *m = json_object_new_object();
        if (!m || json_object_array_add(msgs, m)) {
            json_object_put(m);
            return -2;
        }
        json_object_object_add(m, "role", json_object_new_string("user"));
        json_object_object_add(m, "content", json_object_get(in));
        return 0;
    }
    if (!json_object_is_type(in, json_type_array) || json_object_array_length(in) == 0) {
        snprintf(msg, cap, "'input' must be a string or a non-empty array of items");
        return -1;
    }
    return read_items(msgs, in, tools, msg, cap);
}

/* "tools" in the Responses' flat shape ({type, name, description, parameters, strict}) as
 * the chat's ({type, function: {name, description, parameters}}); hosted tools (web
 * search, file search, ...) are refused: llmsd runs none. *n: how many. */
static int read_tools(json_object *req, json_object *chat, size_t *n, char *msg, size_t cap)
{
    json_object *tools, *v;
    int rc = jsonfield_get(req, "tools", "", json_type_array, &tools, msg, cap);
    *n = rc == 1 ? json_object_array_length(tools) : 0;
    if (rc <= 0)
        return rc;
    json_object *list = json_object_new_array_ext((int)*n);
    if (!list)
        return -2;
    json_object_object_add(chat, "tools", list);
    for (size_t i = 0; i < *n; i++) {
        json_object *t = json_object_array_get_idx(tools, i);
        const char *type = json_object_is_type(t, json_type_object) ? string_member(t, "type")
                                                                    : NULL;
        if (!type) {
            snprintf(msg, cap, "tools[%zu] must be an object with a 'type'", i);
            return -1;
        }
        if (strcmp(type, "function")) {
            snprintf(msg, cap, "tools[%zu]: '%.40s' tools are not supported (only \"function\" "
                               "tools: llmsd runs no hosted tools)", i, type);
            return -1;
        }
        const char *name = string_member(t, "name");
        if (!name || !name[0]) {
            snprintf(msg, cap, "tools[%zu].name must be a non-empty string", i);
            return -1;
        }
        static const struct {
            const char *key;
            json_type type;
        } fields[] = {{"description", json_type_string}, {"parameters", json_type_object},
                      {"strict", json_type_boolean}};
        char where[32];
        snprintf(where, sizeof where, "tools[%zu].", i);
        for (size_t k = 0; k < sizeof fields / sizeof fields[0]; k++)
            if (jsonfield_get(t, fields[k].key, where, fields[k].type, &v, msg, cap) < 0)
                return -1;
        /* strict is read past: a forced call's arguments always follow their parameters */
        json_object *tool = json_object_new_object(), *fn = json_object_new_object();
        if (!tool || !fn || json_object_array_add(list, tool)) {
            json_object_put(tool);
            json_object_put(fn);
            return -2;
        }
        json_object_object_add(tool, "type", json_object_new_string("function"));
        json_object_object_add(fn, "name", json_object_new_string(name));
        if (jsonfield_get(t, "description", "", json_type_string, &v, msg, cap) == 1)
            json_object_object_add(fn, "description", json_object_get(v));
        if (jsonfield_get(t, "parameters", "", json_type_object, &v, msg, cap) == 1)
            json_object_object_add(fn, "parameters", json_object_get(v));
        json_object_object_add(tool, "function", fn);
    }
    return 0;
}

/* "tool_choice": "auto", "none", "required", or a function ({"type": "function",
 * "name"}) as the chat's {"type": "function", "function": {"name"}}. */
static int read_tool_choice(json_object *req, json_object *chat, char *msg, size_t cap)
{
    json_object *v = given(req, "tool_choice");
    if (!v)
        return 0;
    if (json_object_is_type(v, json_type_string)) {
        const char *s = json_object_get_string(v);
        if (!strcmp(s, "auto") || !strcmp(s, "none") || !strcmp(s, "required")) {
            json_object_object_add(chat, "tool_choice", json_object_get(v));
            return 0;
        }
    } else if (json_object_is_type(v, json_type_object)) {
        const char *type = string_member(v, "type"), *name = string_member(v, "name");
        if (type && strcmp(type, "function")) {
            snprintf(msg, cap, "'tool_choice' of type '%.40s' is not supported (llmsd runs no "
                               "hosted tools): \"auto\", \"none\", \"required\" or {\"type\": "
                               "\"function\", \"name\": ...}", type);
            return -1;
        }
        if (type && name) {
            json_object *c = json_object_new_object(), *fn = json_object_new_object();
            if (!c || !fn) {
                json_object_put(c);
                json_object_put(fn);
                return -2;
            }
            json_object_object_add(fn, "name", json_object_new_string(name));
            json_object_object_add(c, "type", json_object_new_string("function"));
            json_object_object_add(c, "function", fn);
            json_object_object_add(chat, "tool_choice", c);
            return 0;
        }
    }
    snprintf(msg, cap, "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": "
                       "\"function\", \"name\": ...}");
    return -1;
}

/* "text": {"format": {"type": "text"}, {"type": "json_object"} or {"type": "json_schema",
 * "name", "schema", "strict"?, "description"?}} as the chat's response_format. */
static int read_text_format(json_object *req, json_object *chat, char *msg, size_t cap)
{
    json_object *text, *f, *schema;
    int rc = jsonfield_get(req, "text", "", json_type_object, &text, msg, cap);
    if (rc <= 0 ||
        (rc = jsonfield_get(text, "format", "text.", json_type_object, &f, msg, cap)) <= 0)
        return rc;
    const char *type = string_member(f, "type");
    if (!type ||
        (strcmp(type, "text") && strcmp(type, "json_object") && strcmp(type, "json_schema"))) {
        snprintf(msg, cap, "'text.format.type' must be \"text\", \"json_object\" or "
                           "\"json_schema\"");
        return -1;
    }
    json_object *rf = json_object_new_object();
    if (!rf)
        return -2;
    json_object_object_add(chat, "response_format", rf);
    json_object_object_add(rf, "type", json_object_new_string(type));
    if (strcmp(type, "json_schema"))
        return 0;
    if (!json_object_object_get_ex(f, "schema", &schema) ||
        !json_object_is_type(schema, json_type_object)) {
        snprintf(msg, cap, "'text.format.schema': a JSON Schema object is required");
        return -1;
    }
    json_object *inner = json_object_new_object();
    if (!inner)
        return -2;
    json_object_object_add(inner, "schema", json_object_get(schema));
    json_object_object_add(rf, "json_schema", inner);
    return 0;
}

/* The fields that refer to what llmsd does not keep, or ask for what it does not give,
 * refused naming them; the others OpenAI defines checked as it documents them and read
 * past. Their "off" values pass. */
static int check_fields(json_object *req, char *msg, size_t cap)
{
    json_object *v;
    if (given(req, "conversation")) {
        snprintf(msg, cap, "'conversation': llmsd keeps no conversations; continue a stored "
                           "response with 'previous_response_id', or send the whole "
                           "conversation as 'input'");
        return -1;
    }
    int rc = jsonfield_get(req, "previous_response_id", "", json_type_string, &v, msg, cap);
    if (rc < 0)
        return -1;
    if (rc && !respstore_id_valid(json_object_get_string(v),
                                  (size_t)json_object_get_string_len(v))) {
        snprintf(msg, cap, "'previous_response_id' is no response id (\"resp_\" and letters, "
                           "digits, '_' or '-', %d characters at most)", RESPSTORE_ID_MAX);
        return -1;
    }
    rc = jsonfield_get(req, "background", "", json_type_boolean, &v, msg, cap);
    if (rc < 0)
        return -1;
    if (rc && json_object_get_boolean(v)) {
        snprintf(msg, cap, "'background': llmsd keeps no responses to fetch later; ask without it");
        return -1;
    }
    if (jsonfield_get(req, "store", "", json_type_boolean, &v, msg, cap) < 0 ||
        jsonfield_get(req, "user", "", json_type_string, &v, msg, cap) < 0 ||
        jsonfield_get(req, "max_output_tokens", "", json_type_int, &v, msg, cap) < 0)
        return -1;
    /* "auto" drops items from the middle of a conversation beyond the window: what is
     * beyond the window is refused 400 either way */
    if ((rc = jsonfield_get(req, "truncation", "", json_type_string, &v, msg, cap)) < 0)
        return -1;
    if (rc && strcmp(json_object_get_string(v), "auto") &&
        strcmp(json_object_get_string(v), "disabled")) {
        snprintf(msg, cap, "'truncation' must be \"auto\" or \"disabled\"");
        return -1;
    }
    if ((rc = jsonfield_get(req, "metadata", "", json_type_object, &v, msg, cap)) < 0)
        return -1;
    if (rc) {
        bool ok = json_object_object_length(v) <= 16;
        json_object_object_foreach(v, key, val)
            ok &= strlen(key) <= 64 && json_object_is_type(val, json_type_string) &&
                  json_object_get_string_len(val) <= 512;
        if (!ok) {
            snprintf(msg, cap, "'metadata' holds at most 16 keys of up to 64 characters, each "
                               "with a string of up to 512");
            return -1;
        }
    }
    /* what include asks for belongs to what llmsd never makes (encrypted reasoning,
     * searches, images) but the text's logprobs */
    if ((rc = jsonfield_get(req, "include", "", json_type_array, &v, msg, cap)) < 0)
        return -1;
    for (size_t i = 0; rc && i < json_object_array_length(v); i++) {
        json_object *s = json_object_array_get_idx(v, i);
        if (!json_object_is_type(s, json_type_string)) {
            snprintf(msg, cap, "'include' must be an array of strings");
            return -1;
        }
        if (!strcmp(json_object_get_string(s), "message.output_text.logprobs")) {
            snprintf(msg, cap, "'include': message.output_text.logprobs is not given on "
                               "/v1/responses (/v1/chat/completions gives logprobs)");
            return -1;
        }
    }
    return 0;
}

int responses_chat_body(json_object *req, json_object *prior, json_object **chat, char *msg,
                        size_t cap)
{
    json_object *v;
    size_t n_tools;
    *chat = json_object_new_object();
    if (!*chat)
        return -2;
    int rc = check_fields(req, msg, cap);
    if (!rc)
        rc = read_tools(req, *chat, &n_tools, msg, cap);
    if (!rc)
        rc = read_input(req, prior, *chat, n_tools > 0, msg, cap);
    if (!rc)
        rc = read_tool_choice(req, *chat, msg, cap);
    if (!rc)
        rc = read_text_format(req, *chat, msg, cap);
    if (rc) {
        json_object_put(*chat);
        *chat = NULL;
        return rc;
    }
    for (size_t i = 0; i < sizeof chat_fields / sizeof chat_fields[0]; i++)
        if (json_object_object_get_ex(req, chat_fields[i], &v))
            json_object_object_add(*chat, chat_fields[i], json_object_get(v));
    if (json_object_object_get_ex(req, "max_output_tokens", &v))
        json_object_object_add(*chat, "max_tokens", json_object_get(v));
    /* "reasoning": {"effort": ...}, the chat's reasoning_effort (gpt-oss's) */
    json_object *effort;
    if (json_object_object_get_ex(req, "reasoning", &v) &&
        json_object_is_type(v, json_type_object) &&
        json_object_object_get_ex(v, "effort", &effort) &&
        !json_object_is_type(effort, json_type_null))
        json_object_object_add(*chat, "reasoning_effort", json_object_get(effort));
    return 0;
}

/* The conversation of uid's stored response id, fresh in *items: its input items, then
 * its output items, as the next turn continues it. 0; 1 when uid has no response id; -2
 * out of memory. */
static int stored_conversation(http *h, uid_t uid, const char *id, json_object **items)
{
    respstore_entry e;
    *items = NULL;
    if (!respstore_get(h->store, uid, id, &e))
        return 1;
    json_object *in = json_tokener_parse(e.items), *resp = json_tokener_parse(e.response);
    json_object *out = given(resp, "output");
    int rc = json_object_is_type(in, json_type_array) && json_object_is_type(out, json_type_array)
                 ? 0 : -2;
    for (size_t i = 0; rc == 0 && i < json_object_array_length(out); i++)
        if (json_object_array_add(in, json_object_get(json_object_array_get_idx(out, i))))
            rc = -2;
    json_object_put(resp);
    if (rc)
        json_object_put(in);
    else
        *items = in;
    return rc;
}

/* The id prefix OpenAI gives an item of type. */
static const char *item_prefix(const char *type)
{
    return !strcmp(type, "message")                ? "msg_"
           : !strcmp(type, "function_call")        ? "fc_"
           : !strcmp(type, "function_call_output") ? "fco_"
           : !strcmp(type, "reasoning")            ? "rs_"
                                                   : "item_";
}

/* The input items to store with hr's response: prior's (the previous response's
 * conversation, or NULL), then the body's input (a string as a user message of one
 * input_text part, as OpenAI lists it; an item without a type as a message), each item
 * whose id is not a string of up to RESPSTORE_ID_MAX bytes given one of the response's
 * hex digits and its place in the input. NULL out of memory. */
static json_object *input_items(const hreq *hr, json_object *prior)
{
    json_object *items = json_object_new_array(), *in = given(hr->rs->request, "input");
    const char *hex = hr->id + strlen("resp_");
    char id[RESPSTORE_ID_MAX + 1];
    for (size_t i = 0; items && prior && i < json_object_array_length(prior); i++)
        if (json_object_array_add(items, json_object_get(json_object_array_get_idx(prior, i))))
            goto oom;
    if (!items)
        return NULL;
    if (json_object_is_type(in, json_type_string)) {
        json_object *m = json_object_new_object(), *content = json_object_new_array();
        json_object *part = json_object_new_object();
        if (!m || !content || !part || json_object_array_add(items, m)) {
            json_object_put(m);
            json_object_put(content);
            json_object_put(part);
            goto oom;
        }
        snprintf(id, sizeof id, "msg_%s_0", hex);
        json_object_object_add(m, "id", json_object_new_string(id));
        json_object_object_add(m, "type", json_object_new_string("message"));
        json_object_object_add(m, "role", json_object_new_string("user"));
        json_object_object_add(part, "type", json_object_new_string("input_text"));
        json_object_object_add(part, "text", json_object_get(in));
        json_object_array_add(content, part);
        json_object_object_add(m, "content", content);
        return items;
    }
    for (size_t i = 0; i < json_object_array_length(in); i++) {
        json_object *item = json_object_array_get_idx(in, i), *copy = json_object_new_object();
        if (!copy || json_object_array_add(items, copy)) {
            json_object_put(copy);
            goto oom;
        }
        json_object_object_foreach(item, key, val)
            json_object_object_add(copy, key, json_object_get(val));
        const char *type = given(item, "type") ? string_member(item, "type") : NULL;
        if (!type)
            json_object_object_add(copy, "type", json_object_new_string(type = "message"));
        const char *have = string_member(item, "id");
        if (!have || !have[0] || strlen(have) > RESPSTORE_ID_MAX) {
            snprintf(id, sizeof id, "%s%s_%zu", item_prefix(type), hex, i);
            json_object_object_add(copy, "id", json_object_new_string(id));
        }
    }
    return items;
oom:
    json_object_put(items);
    return NULL;
}

void responses_start(hreq *hr, Llms__Request *r, char *msg, size_t cap)
{
    json_object *chat, *prior = NULL, *v;
    struct responses_req *rs = hr->rs = calloc(1, sizeof *hr->rs);
    if (!rs) {
        openai_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    rs->msg_index = rs->rs_index = -1;
    /* an id that is none is refused 400 with the other fields */
    const char *prev = string_member(hr->body, "previous_response_id");
    int rc = prev && respstore_id_valid(prev, strlen(prev))
                 ? stored_conversation(hr->h, hr->ss.uid, prev, &prior) : 0;
    if (rc == 1) {
        http_req_finish(hr);
        openai_send_error(hr->h, hr->wc, hr->route, 404, "invalid_request_error",
                          "previous_response_not_found",
                          "Previous response with id '%s' not found.", prev);
        return;
    }
    if (rc == 0)
        rc = responses_chat_body(hr->body, prior, &chat, msg, cap);
    if (rc) {
        json_object_put(prior);
        openai_finish_error(hr, rc == -2 ? LLMS__ERROR_CODE__INTERNAL
                                         : LLMS__ERROR_CODE__INVALID_ARGUMENT,
                            rc == -2 ? "out of memory" : msg);
        return;
    }
    /* the body as sent is the answer's to echo; model_named still points into it */
    rs->request = hr->body;
    hr->body = chat;
    rs->previous = prev;
    rs->store = respstore_on(hr->h->store) &&
                (!json_object_object_get_ex(rs->request, "store", &v) || !v ||
                 json_object_get_boolean(v));
    /* out of memory, the response is not stored, which its store field says */
    if (rs->store && !(rs->items = input_items(hr, prior)))
        rs->store = false;
    json_object_put(prior);
    openai_start_generate(hr, r, msg, cap);
}

/* ---- the response ---- */

/* How a reply that stopped for r (with calls or not) ends: "completed", or "incomplete"
 * and *why: OpenAI's max_output_tokens for a reply cut by its budget or the window,
 * llmsd's word where OpenAI has none (cancelled, deadline, shutdown), as the chat's
 * finish_reason keeps them. A reply with calls is complete, as its chat is "tool_calls". */
static const char *status_of(Llms__StopReason r, bool calls, const char **why)
{
    const char *fin = openai_finish_reason(r);
    *why = NULL;
    if (calls || !strcmp(fin, "stop"))
        return "completed";
    *why = !strcmp(fin, "length") ? "max_output_tokens" : fin;
    return "incomplete";
}

/* The message item's id: the response's hex digits after "msg_". */
static void message_id(const hreq *hr, char out[64])
{
    snprintf(out, 64, "msg_%s", hr->id + strlen("resp_"));
}

static json_object *text_part(const char *text, size_t n)
{
    json_object *p = json_object_new_object();
    if (p) {
        json_object_object_add(p, "type", json_object_new_string("output_text"));
        json_object_object_add(p, "text", json_object_new_string_len(text, (int)n));
        json_object_object_add(p, "annotations", json_object_new_array());
    }
    return p;
}

/* The assistant's message item: n bytes of text as its one output_text part, or (text
 * NULL) none yet. */
static json_object *message_item(const hreq *hr, const char *text, size_t n, const char *status)
{
    char id[64];
    json_object *m = json_object_new_object(), *content = json_object_new_array();
    if (!m || !content) {
        json_object_put(m);
        json_object_put(content);
        return NULL;
    }
    message_id(hr, id);
    json_object_object_add(m, "type", json_object_new_string("message"));
    json_object_object_add(m, "id", json_object_new_string(id));
    json_object_object_add(m, "status", json_object_new_string(status));
    json_object_object_add(m, "role", json_object_new_string("assistant"));
    if (text)
        json_object_array_add(content, text_part(text, n));
    json_object_object_add(m, "content", content);
    return m;
}

/* A call of the reply ({"id": "call_...", "name", "arguments"}, toolcall.h) as a
 * function_call item: its id "fc_" and the call id's digits, its arguments a JSON string
 * (none yet while in progress). */
static json_object *call_item(json_object *call, bool done)
{
    const char *call_id = string_member(call, "id"), *name = string_member(call, "name");
    char id[64];
    json_object *item = json_object_new_object();
    if (!item || !call_id || !name) {
        json_object_put(item);
        return NULL;
    }
    snprintf(id, sizeof id, "fc_%s", call_id + (strncmp(call_id, "call_", 5) ? 0 : 5));
    json_object_object_add(item, "type", json_object_new_string("function_call"));
    json_object_object_add(item, "id", json_object_new_string(id));
    json_object_object_add(item, "call_id", json_object_new_string(call_id));
    json_object_object_add(item, "name", json_object_new_string(name));
    json_object_object_add(item, "arguments",
                           json_object_new_string(done ? toolcall_arguments_text(call) : ""));
    json_object_object_add(item, "status", json_object_new_string(done ? "completed"
                                                                       : "in_progress"));
    return item;
}

/* The reasoning item's id: the response's hex digits after "rs_". */
static void reasoning_id(const hreq *hr, char out[64])
{
    snprintf(out, 64, "rs_%s", hr->id + strlen("resp_"));
}

/* The reasoning item (the SDK's ResponseReasoningItem: no summary, as llmsd makes none):
 * n bytes of the model's reasoning as its one reasoning_text part, as newer SDKs and vLLM
 * give it, or (text NULL) none yet. */
static json_object *reasoning_item(const hreq *hr, const char *text, size_t n, const char *status)
{
    char id[64];
    json_object *r = json_object_new_object(), *content = json_object_new_array(), *part = NULL;
    if (!r || !content || (text && !(part = json_object_new_object()))) {
        json_object_put(r);
        json_object_put(content);
        return NULL;
    }
    reasoning_id(hr, id);
    json_object_object_add(r, "type", json_object_new_string("reasoning"));
    json_object_object_add(r, "id", json_object_new_string(id));
    json_object_object_add(r, "summary", json_object_new_array());
    if (part) {
        json_object_object_add(part, "type", json_object_new_string("reasoning_text"));
        json_object_object_add(part, "text", json_object_new_string_len(text, (int)n));
        json_object_array_add(content, part);
    }
    json_object_object_add(r, "content", content);
    json_object_object_add(r, "status", json_object_new_string(status));
    return r;
}

/* OpenAI's usage of a response: cached_tokens are the prompt tokens resumed from the
 * prompt cache, as the chat's; reasoning_tokens only when it is exactly 0 (reasoned: the
 * reply had reasoning, whose tokens are not counted apart, and are not guessed at). */
static json_object *usage_obj(const Llms__CallResult *res, bool reasoned)
{
    json_object *u = json_object_new_object(), *in = json_object_new_object();
    json_object *out = json_object_new_object();
    if (!u || !in || !out) {
        json_object_put(u);
        json_object_put(in);
        json_object_put(out);
        return NULL;
    }
    json_object_object_add(u, "input_tokens", json_object_new_int64(res->prompt_tokens));
    json_object_object_add(in, "cached_tokens",
                           json_object_new_int64(res->has_cached_tokens ? res->cached_tokens : 0));
    json_object_object_add(u, "input_tokens_details", in);
    json_object_object_add(u, "output_tokens", json_object_new_int64(res->generated_tokens));
    if (!reasoned)
        json_object_object_add(out, "reasoning_tokens", json_object_new_int64(0));
    json_object_object_add(u, "output_tokens_details", out);
    int64_t total = (int64_t)res->prompt_tokens + res->generated_tokens;
    json_object_object_add(u, "total_tokens", json_object_new_int64(total));
    return u;
}

/* The request's field key as sent (a new reference), or dflt (taken) when absent or
 * null. */
static json_object *echo(const hreq *hr, const char *key, json_object *dflt)
{
    json_object *v = given(hr->rs->request, key);
    if (v) {
        json_object_put(dflt);
        return json_object_get(v);
    }
    return dflt;
}

/* A float setting as JSON writes it: 0.95, not the double nearest the float. */
static json_object *float_number(float f)
{
    char s[32];
    snprintf(s, sizeof s, "%.7g", (double)f);
    return json_object_new_double_s(strtod(s, NULL), s);
}

/* The response object: its status (and why it is incomplete), output items, usage and
 * error (each taken; NULL: null), and the request's settings as the SDKs' types have
 * them, the defaults llmsd used for those not sent. */
static json_object *response_obj(const hreq *hr, const char *status, const char *why,
                                  json_object *output, json_object *usage, json_object *error)
{
    const config *cfg = hr->h->cfg;
    json_object *o = json_object_new_object(), *details = NULL, *text, *format, *v;
    if (!o) {
        json_object_put(output);
        json_object_put(usage);
        json_object_put(error);
        return NULL;
    }
    json_object_object_add(o, "id", json_object_new_string(hr->id));
    json_object_object_add(o, "object", json_object_new_string("response"));
    json_object_object_add(o, "created_at", json_object_new_int64(hr->created));
    json_object_object_add(o, "status", json_object_new_string(status));
    json_object_object_add(o, "background", json_object_new_boolean(0));
    json_object_object_add(o, "error", error);
    if (why && (details = json_object_new_object()))
        json_object_object_add(details, "reason", json_object_new_string(why));
    json_object_object_add(o, "incomplete_details", details);
    json_object_object_add(o, "instructions", echo(hr, "instructions", NULL));
    json_object_object_add(o, "max_output_tokens", echo(hr, "max_output_tokens", NULL));
    json_object_object_add(o, "metadata", echo(hr, "metadata", json_object_new_object()));
    json_object_object_add(o, "model", json_object_new_string(hr->model));
    json_object_object_add(o, "output", output ? output : json_object_new_array());
    json_object_object_add(o, "parallel_tool_calls",
                           echo(hr, "parallel_tool_calls", json_object_new_boolean(1)));
    json_object_object_add(o, "previous_response_id",
                           hr->rs->previous ? json_object_new_string(hr->rs->previous) : NULL);
    json_object_object_add(o, "store", json_object_new_boolean(hr->rs->store));
    json_object_object_add(o, "temperature",
                           echo(hr, "temperature", float_number(cfg->temperature)));
    if ((text = json_object_new_object())) {
        format = json_object_object_get_ex(hr->rs->request, "text", &v)
                     ? json_object_object_get(v, "format") : NULL;
        if (format)
            format = json_object_get(format);
        else if ((format = json_object_new_object()))
            json_object_object_add(format, "type", json_object_new_string("text"));
        json_object_object_add(text, "format", format);
    }
    json_object_object_add(o, "text", text);
    json_object_object_add(o, "tool_choice",
                           echo(hr, "tool_choice", json_object_new_string("auto")));
    json_object_object_add(o, "tools", echo(hr, "tools", json_object_new_array()));
    json_object_object_add(o, "top_p", echo(hr, "top_p", float_number(cfg->top_p)));
    json_object_object_add(o, "truncation",
                           echo(hr, "truncation", json_object_new_string("disabled")));
    json_object_object_add(o, "usage", usage);
    if (string_member(hr->rs->request, "user"))
        json_object_object_add(o, "user", echo(hr, "user", NULL));
    return o;
}

/* Hands a change of the stored responses to the worker, which makes it in the store too
 * (responses_store = disk); one that cannot be handed over (out of memory) is made in
 * memory alone, with a warning. */
static void persist(http *h, enum sched_job_kind kind, const store_response *r)
{
    if (strcmp(h->cfg->responses_store, "disk"))
        return;
    sched_job *j = sched_response_job(kind, r);
    if (j)
        sched_submit(h->senv.sch, j);
    else if (reqlog_enabled(REQLOG_WARN))
        fprintf(stderr, "llmsd: warn: stored response %s: out of memory (%s)\n", r->id,
                kind == SCHED_RESPONSE_PUT ? "kept in memory only, not after a restart"
                                           : "deleted in memory, back after a restart");
}

/* Stores o (hr's last response object, NULL out of memory) when hr is to be stored, with
 * the input items it answered, whatever its status; one the store does not take (over
 * half its budget, or out of memory) says store false. */
static void keep(hreq *hr, json_object *o)
{
    struct responses_req *rs = hr->rs;
    const int flags = JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE;
    size_t n_items, n;
    if (!o || !rs->store)
        return;
    const char *items = json_object_to_json_string_length(rs->items, flags, &n_items);
    const char *text = json_object_to_json_string_length(o, flags, &n);
    if (!items || !text ||
        respstore_put(hr->h->store, hr->ss.uid, hr->id, text, n, items, n_items)) {
        rs->store = false;
        json_object_object_add(o, "store", json_object_new_boolean(0));
        return;
    }
    store_response r = {.id = hr->id, .uid = hr->ss.uid, .created = hr->created,
                        .previous = rs->previous, .response = text, .response_len = n,
                        .items = items, .items_len = n_items,
                        .bytes = (int64_t)respstore_bytes_of(n, n_items)};
    persist(hr->h, SCHED_RESPONSE_PUT, &r);
}

/* The whole response of a reply: its reasoning as a reasoning item, its text as the
 * message item (unless it is all calls or all reasoning) and each call as a function_call
 * item. */
static void reply_whole(hreq *hr, const Llms__CallResult *res)
{
    const char *why;
    toolcall_out out = {0};
    reasoning_span r, c;
    int split = openai_split_whole(hr, res->text, &r, &c);
    const char *text = c.text;
    size_t len = c.n;
    json_object *output = json_object_new_array();
    if (!output || split < 0 ||
        (hr->scan && toolcall_scan_feed(hr->scan, text, len, true, &out) < 0)) {
        json_object_put(output);
        toolcall_out_free(&out);
        openai_send_error(hr->h, hr->wc, hr->route, 500, "server_error", "internal_error",
                          "out of memory");
        return;
    }
    if (hr->scan) {
        text = out.content ? out.content : "";
        len = out.content_len;
    }
    size_t n_calls = out.calls ? json_object_array_length(out.calls) : 0;
    const char *status = status_of(res->stop_reason, n_calls > 0, &why);
    /* the reasoning is done once something follows it, as a stream closes it then */
    if (r.n)
        json_object_array_add(output, reasoning_item(hr, r.text, r.n,
                                                     len || n_calls ? "completed" : status));
    if (len || (!n_calls && !r.n))
        json_object_array_add(output, message_item(hr, text, len, status));
    for (size_t i = 0; i < n_calls; i++)
        json_object_array_add(output, call_item(json_object_array_get_idx(out.calls, i), true));
    toolcall_out_free(&out);
    json_object *o = response_obj(hr, status, why, output, usage_obj(res, r.n > 0), NULL);
    if (o)
        json_object_object_add(o, "llmsd", openai_llmsd_obj(hr));
    keep(hr, o);
    http_send_json(hr->h, hr->wc, hr->route, 200, o);
}

/* ---- the stream ---- */

/* Begins an event of type: its "event:" line and its data up to the sequence number; the
 * caller adds its members and "}\n\n". */
static void event_open(hreq *hr, const char *type)
{
    evbuffer_add_printf(hr->sse, "event: %s\ndata: {\"type\":\"%s\",\"sequence_number\":%llu",
                        type, type, (unsigned long long)hr->rs->seq++);
}

/* One event of type with members' members (taken; their keys need no escaping). */
static void event_put(hreq *hr, const char *type, json_object *members)
{
    event_open(hr, type);
    if (members) {
        json_object_object_foreach(members, key, val)
            evbuffer_add_printf(hr->sse, ",\"%s\":%s", key, val ? http_json_text(val) : "null");
    }
    evbuffer_add(hr->sse, "}\n\n", 3);
    json_object_put(members);
}

/* {"key": value (taken)} and more pairs, ending at a NULL key: an event's members. */
static json_object *members(const char *key, json_object *value, ...)
{
    json_object *o = json_object_new_object();
    va_list ap;
    va_start(ap, value);
    for (; key; key = va_arg(ap, const char *), value = key ? va_arg(ap, json_object *) : NULL) {
        if (o)
            json_object_object_add(o, key, value);
        else
            json_object_put(value);
    }
    va_end(ap);
    return o;
}

int responses_sse_start(hreq *hr)
{
    if (hr->started)
        return 0;
    struct responses_req *rs = hr->rs;
    if (!(rs->output = json_object_new_array()) || !(rs->text = evbuffer_new()) ||
        !(rs->reasoning = evbuffer_new()))
        return -1;
    httpwire_add_header(hr->wc, "Content-Type", "text/event-stream");
    httpwire_add_header(hr->wc, "Cache-Control", "no-cache");
    httpwire_stream_start(hr->wc, 200);
    http_count_status(hr->h, hr->route, 200);
    hr->started = true;
    event_put(hr, "response.created",
              members("response", response_obj(hr, "in_progress", NULL, NULL, NULL, NULL), NULL));
    event_put(hr, "response.in_progress",
              members("response", response_obj(hr, "in_progress", NULL, NULL, NULL, NULL), NULL));
    httpwire_stream_chunk(hr->wc, hr->sse);
    return 0;
}

/* The message item's place and id in an event's members. */
static json_object *in_message(hreq *hr, const char *key, json_object *value)
{
    char id[64];
    message_id(hr, id);
    return members("item_id", json_object_new_string(id), "output_index",
                   json_object_new_int(hr->rs->msg_index), "content_index", json_object_new_int(0),
                   key, value, NULL);
}

/* The message item begins: added, with its output_text part. */
static void open_message(hreq *hr)
{
    struct responses_req *rs = hr->rs;
    rs->msg_index = (int)json_object_array_length(rs->output);
    json_object *item = message_item(hr, NULL, 0, "in_progress");
    json_object_array_add(rs->output, item);
    event_put(hr, "response.output_item.added",
              members("output_index", json_object_new_int(rs->msg_index), "item",
                      json_object_get(item), NULL));
    event_put(hr, "response.content_part.added", in_message(hr, "part", text_part("", 0)));
}

/* n bytes of the message's text as one delta event (the message begins with its first).
 * Written here rather than through json-c, which would build objects per token. */
static void text_delta(hreq *hr, const char *text, size_t n)
{
    struct responses_req *rs = hr->rs;
    char id[64];
    if (rs->msg_index < 0)
        open_message(hr);
    message_id(hr, id);
    event_open(hr, "response.output_text.delta");
    evbuffer_add_printf(hr->sse, ",\"item_id\":\"%s\",\"output_index\":%d,\"content_index\":0,"
                                 "\"delta\":\"", id, rs->msg_index);
    openai_add_escaped(hr->sse, text, n);
    evbuffer_add(hr->sse, "\",\"logprobs\":[]}\n\n", 18);
    evbuffer_add(rs->text, text, n);
}

/* n bytes of reasoning as one response.reasoning.delta event (its item begins with the
 * first), as the SDK's ResponseReasoningDeltaEvent has it. */
static void reasoning_delta(hreq *hr, const char *text, size_t n)
{
    struct responses_req *rs = hr->rs;
    char id[64];
    reasoning_id(hr, id);
    if (rs->rs_index < 0) {
        rs->rs_index = (int)json_object_array_length(rs->output);
        json_object *item = reasoning_item(hr, NULL, 0, "in_progress");
        json_object_array_add(rs->output, item);
        event_put(hr, "response.output_item.added",
                  members("output_index", json_object_new_int(rs->rs_index), "item",
                          json_object_get(item), NULL));
    }
    event_open(hr, "response.reasoning.delta");
    evbuffer_add_printf(hr->sse, ",\"item_id\":\"%s\",\"output_index\":%d,\"content_index\":0,"
                                 "\"delta\":\"", id, rs->rs_index);
    openai_add_escaped(hr->sse, text, n);
    evbuffer_add(hr->sse, "\"}\n\n", 4);
    evbuffer_add(rs->reasoning, text, n);
}

/* The reasoning item ends (when it began and is not done yet) with the text it streamed:
 * response.reasoning.done, then the item done with its status. */
static void close_reasoning(hreq *hr, const char *status)
{
    struct responses_req *rs = hr->rs;
    if (rs->rs_index < 0 || rs->rs_done)
        return;
    rs->rs_done = true;
    char id[64];
    reasoning_id(hr, id);
    size_t n = evbuffer_get_length(rs->reasoning);
    const char *text = n ? (const char *)evbuffer_pullup(rs->reasoning, -1) : "";
    n = text ? n : 0;
    event_put(hr, "response.reasoning.done",
              members("item_id", json_object_new_string(id), "output_index",
                      json_object_new_int(rs->rs_index), "content_index", json_object_new_int(0),
                      "text", json_object_new_string_len(text ? text : "", (int)n), NULL));
    json_object *item = reasoning_item(hr, text ? text : "", n, status);
    json_object_array_put_idx(rs->output, (size_t)rs->rs_index, item);
    event_put(hr, "response.output_item.done",
              members("output_index", json_object_new_int(rs->rs_index), "item",
                      json_object_get(item), NULL));
}

/* A call, whole: its item added, its arguments in one delta, then done. */
static void stream_call(hreq *hr, json_object *call)
{
    struct responses_req *rs = hr->rs;
    int index = (int)json_object_array_length(rs->output);
    json_object *item = call_item(call, false), *done = call_item(call, true);
    if (!item || !done) {
        json_object_put(item);
        json_object_put(done);
        return;
    }
    const char *id = string_member(done, "id"), *args = toolcall_arguments_text(call);
    json_object_array_add(rs->output, done);
    event_put(hr, "response.output_item.added",
              members("output_index", json_object_new_int(index), "item", item, NULL));
    event_put(hr, "response.function_call_arguments.delta",
              members("item_id", json_object_new_string(id), "output_index",
                      json_object_new_int(index), "delta", json_object_new_string(args), NULL));
    event_put(hr, "response.function_call_arguments.done",
              members("item_id", json_object_new_string(id), "output_index",
                      json_object_new_int(index), "arguments", json_object_new_string(args), NULL));
    event_put(hr, "response.output_item.done",
              members("output_index", json_object_new_int(index), "item", json_object_get(done),
                      NULL));
}

/* Streams n bytes of the reply's content (end: its last ones): text deltas, or through
 * hr's scan the text as it is decided and each call once whole. -1 out of memory. */
static int stream_content(hreq *hr, const char *text, size_t n, bool end)
{
    if (!hr->scan) {
        if (n)
            text_delta(hr, text, n);
        hr->choices[0].sent += n;
        return 0;
    }
    toolcall_out out;
    int rc = toolcall_scan_feed(hr->scan, text, n, end, &out);
    if (rc == 0 && out.content_len)
        text_delta(hr, out.content, out.content_len);
    for (size_t i = 0; rc == 0 && i < json_object_array_length(out.calls); i++)
        stream_call(hr, json_object_array_get_idx(out.calls, i));
    toolcall_out_free(&out);
    return rc;
}

/* A run of the split: the reasoning item's delta, or (the item done) content. */
static int stream_run(void *arg, bool reasoning, const char *text, size_t n)
{
    hreq *hr = arg;
    if (reasoning) {
        reasoning_delta(hr, text, n);
        return 0;
    }
    close_reasoning(hr, "completed");
    return stream_content(hr, text, n, false);
}

/* Streams n bytes of the reply (end: its last ones): through its split when it is told
 * apart, the reasoning item's deltas and then, the item done, the content. -1 out of
 * memory. */
static int stream_reply(hreq *hr, const char *text, size_t n, bool end)
{
    if (!hr->reasoning)
        return stream_content(hr, text, n, end);
    if (reasoning_feed_each(&hr->choices[0].split, text, n, end, stream_run, hr) < 0)
        return -1;
    return end ? stream_content(hr, "", 0, true) : 0;
}

void responses_sse_piece(hreq *hr, const char *text, size_t n)
{
    if (stream_reply(hr, text, n, false) < 0) {
        responses_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    httpwire_stream_chunk(hr->wc, hr->sse);
}

/* The message item ends with the text it streamed: the text, its part and the item done. */
static void close_message(hreq *hr, const char *status)
{
    struct responses_req *rs = hr->rs;
    size_t n = evbuffer_get_length(rs->text);
    const char *text = n ? (const char *)evbuffer_pullup(rs->text, -1) : "";
    json_object *item = message_item(hr, text ? text : "", text ? n : 0, status);
    event_put(hr, "response.output_text.done",
              in_message(hr, "text", json_object_new_string_len(text ? text : "",
                                                                 text ? (int)n : 0)));
    event_put(hr, "response.content_part.done",
              in_message(hr, "part", text_part(text ? text : "", text ? n : 0)));
    json_object_array_put_idx(rs->output, (size_t)rs->msg_index, item);
    event_put(hr, "response.output_item.done",
              members("output_index", json_object_new_int(rs->msg_index), "item",
                      json_object_get(item), NULL));
}

/* The stream's end: the rest of the reply (what chunks dropped for a slow reader left out,
 * what the split and the scan held back), the reasoning item and the message item closed
 * (an empty message when the reply had nothing at all), then response.completed or
 * response.incomplete. */
static void stream_end(hreq *hr, const Llms__CallResult *res)
{
    struct responses_req *rs = hr->rs;
    size_t len = strlen(res->text);
    size_t fed = hr->reasoning ? reasoning_fed(&hr->choices[0].split)
                 : hr->scan    ? toolcall_scan_fed(hr->scan)
                               : hr->choices[0].sent;
    size_t from = fed < len ? fed : len;
    if (stream_reply(hr, res->text + from, len - from, true) < 0) {
        responses_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    const char *why;
    const char *status = status_of(res->stop_reason, hr->scan && toolcall_scan_calls(hr->scan),
                                   &why);
    close_reasoning(hr, status);
    if (rs->msg_index < 0 && json_object_array_length(rs->output) == 0)
        open_message(hr);
    if (rs->msg_index >= 0)
        close_message(hr, status);
    json_object *o = response_obj(hr, status, why, json_object_get(rs->output),
                                  usage_obj(res, rs->rs_index >= 0), NULL);
    if (o)
        json_object_object_add(o, "llmsd", openai_llmsd_obj(hr));
    keep(hr, o);
    event_put(hr, strcmp(status, "completed") ? "response.incomplete" : "response.completed",
              members("response", o, NULL));
    httpwire_stream_chunk(hr->wc, hr->sse);
    httpwire_stream_end(hr->wc);
}

void responses_on_result(hreq *hr, Llms__Response *r)
{
    gen_choice *c = &hr->choices[0];
    if (c->result) {
        frame_free_response(r);
        responses_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "two results of one request");
        return;
    }
    c->result = r; /* freed with hr */
    hr->n_ended++;
    const Llms__CallResult *res = r->result;
    hr->h->prompt_tokens += res->prompt_tokens;
    hr->h->cached_tokens += res->has_cached_tokens ? res->cached_tokens : 0;
    hr->h->completion_tokens += res->generated_tokens;
    if (hr->stream && responses_sse_start(hr)) {
        responses_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    http_req_finish(hr);
    if (hr->stream)
        stream_end(hr, res);
    else
        reply_whole(hr, res);
}

/* OpenAI's ResponseError code of a native error that ends a stream. */
static const char *error_code(Llms__ErrorCode code)
{
    switch (code) {
    case LLMS__ERROR_CODE__RESOURCE_EXHAUSTED:
        return "rate_limit_exceeded";
    case LLMS__ERROR_CODE__INVALID_ARGUMENT:
        return "invalid_prompt";
    default:
        return "server_error";
    }
}

/* The output items of a stream that ends before its result (failed, or its client
 * gone): the reasoning and message items as far as they streamed, with status; a new
 * reference to rs->output. */
static json_object *output_so_far(hreq *hr, const char *status)
{
    struct responses_req *rs = hr->rs;
    const char *text;
    size_t n;
    if (rs->rs_index >= 0 && !rs->rs_done) {
        n = evbuffer_get_length(rs->reasoning);
        text = n ? (const char *)evbuffer_pullup(rs->reasoning, -1) : "";
        json_object_array_put_idx(rs->output, (size_t)rs->rs_index,
                                  reasoning_item(hr, text ? text : "", text ? n : 0, status));
    }
    if (rs->msg_index >= 0) {
        n = evbuffer_get_length(rs->text);
        text = n ? (const char *)evbuffer_pullup(rs->text, -1) : "";
        json_object_array_put_idx(rs->output, (size_t)rs->msg_index,
                                  message_item(hr, text ? text : "", text ? n : 0, status));
    }
    return json_object_get(rs->output);
}

void responses_finish_error(hreq *hr, Llms__ErrorCode code, const char *msg)
{
    if (!hr->started) {
        openai_finish_error(hr, code, msg);
        return;
    }
    /* The stream has begun with 200: the response fails in its last event, with the
     * items streamed so far, and is stored so, as OpenAI keeps a failed response. */
    http_req_finish(hr);
    json_object *e = members("code", json_object_new_string(error_code(code)), "message",
                             json_object_new_string(msg), NULL);
    json_object *o = response_obj(hr, "failed", NULL, output_so_far(hr, "incomplete"), NULL, e);
    keep(hr, o);
    event_put(hr, "response.failed", members("response", o, NULL));
    httpwire_stream_chunk(hr->wc, hr->sse);
    httpwire_stream_end(hr->wc);
}

void responses_gone(hreq *hr)
{
    if (!hr->rs || !hr->rs->store || !hr->started)
        return;
    json_object *o = response_obj(hr, "incomplete", openai_finish_reason(
                                      LLMS__STOP_REASON__STOP_CANCELLED),
                                  output_so_far(hr, "incomplete"), NULL, NULL);
    keep(hr, o);
    json_object_put(o);
}

/* ---- stored responses: GET, DELETE, input_items ---- */

/* The value of key in query (a URI's text after '?'), *n bytes; NULL when absent. */
static const char *query_value(const char *query, const char *key, size_t *n)
{
    size_t k = strlen(key);
    for (const char *p = query; *p && *p != '#';) {
        size_t len = strcspn(p, "&#");
        if (len > k && !strncmp(p, key, k) && p[k] == '=') {
            *n = len - k - 1;
            return p + k + 1;
        }
        p += len + (p[len] == '&');
    }
    return NULL;
}

/* Answers 400 for a query parameter of input_items. */
static void bad_param(http *h, httpwire_conn *wc, const char *what)
{
    openai_send_error(h, wc, R_RESPONSE_ITEMS, 400, "invalid_request_error", "invalid_request",
                      "%s", what);
}

/* The page of items input_items asks for (query: limit 1..100, default 20; order asc or
 * desc, the default; after: the id of the item the page follows) as OpenAI's list. */
static void send_items(http *h, httpwire_conn *wc, json_object *items, const char *query)
{
    size_t n, total = json_object_array_length(items);
    const char *v;
    long limit = 20;
    bool desc = true;
    if ((v = query_value(query, "limit", &n))) {
        char digits[8];
        snprintf(digits, sizeof digits, "%.*s", (int)(n < 7 ? n : 7), v);
        limit = n && n < 7 && strspn(digits, "0123456789") == n ? strtol(digits, NULL, 10) : 0;
        if (limit < 1 || limit > 100) {
            bad_param(h, wc, "'limit' must be an integer from 1 to 100");
            return;
        }
    }
    if ((v = query_value(query, "order", &n))) {
        if ((n != 3 || strncmp(v, "asc", 3)) && (n != 4 || strncmp(v, "desc", 4))) {
            bad_param(h, wc, "'order' must be \"asc\" or \"desc\"");
            return;
        }
        desc = n == 4;
    }
    size_t from = 0; /* the first item of the page, counted in the list's order */
    if ((v = query_value(query, "after", &n))) {
        for (from = 0; from < total; from++) {
            json_object *item = json_object_array_get_idx(items, desc ? total - 1 - from : from);
            const char *id = string_member(item, "id");
            if (id && strlen(id) == n && !strncmp(id, v, n))
                break;
        }
        if (from == total) {
            char m[160];
            snprintf(m, sizeof m, "'after': no input item '%.*s' in this response",
                     (int)(n < 80 ? n : 80), v);
            bad_param(h, wc, m);
            return;
        }
        from++;
    }
    size_t count = total - from < (size_t)limit ? total - from : (size_t)limit;
    json_object *o = json_object_new_object(), *data = json_object_new_array_ext((int)count);
    if (!o || !data) {
        json_object_put(o);
        json_object_put(data);
        http_send_json(h, wc, R_RESPONSE_ITEMS, 500, NULL);
        return;
    }
    for (size_t i = from; i < from + count; i++)
        json_object_array_add(data, json_object_get(json_object_array_get_idx(
                                        items, desc ? total - 1 - i : i)));
    json_object *first = count ? given(json_object_array_get_idx(data, 0), "id") : NULL;
    json_object *last = count ? given(json_object_array_get_idx(data, count - 1), "id") : NULL;
    json_object_object_add(o, "object", json_object_new_string("list"));
    json_object_object_add(o, "data", data);
    json_object_object_add(o, "first_id", json_object_get(first));
    json_object_object_add(o, "last_id", json_object_get(last));
    json_object_object_add(o, "has_more", json_object_new_boolean(from + count < total));
    http_send_json(h, wc, R_RESPONSE_ITEMS, 200, o);
}

void responses_send_stored(http *h, httpwire_conn *wc, enum route r, const char *uri,
                           size_t plen, bool del, uid_t uid)
{
    static const char base[] = "/v1/responses/", items[] = "/input_items";
    const char *id = uri + strlen(base);
    size_t n = plen - strlen(base) - (r == R_RESPONSE_ITEMS ? strlen(items) : 0);
    char key[RESPSTORE_ID_MAX + 1];
    respstore_entry e;
    if (!respstore_id_valid(id, n)) {
        openai_send_error(h, wc, r, 400, "invalid_request_error", "invalid_request",
                          "'%.*s' is no response id (\"resp_\" and letters, digits, '_' or '-', "
                          "%d characters at most)", (int)(n < 80 ? n : 80), id, RESPSTORE_ID_MAX);
        return;
    }
    memcpy(key, id, n);
    key[n] = '\0';
    /* another uid's response is not there for this one: the same answer as for none */
    if (!respstore_get(h->store, uid, key, &e)) {
        openai_send_error(h, wc, r, 404, "invalid_request_error", "not_found",
                          "Response with id '%s' not found.", key);
        return;
    }
    if (r == R_RESPONSE && del) {
        respstore_delete(h->store, uid, key);
        persist(h, SCHED_RESPONSE_DELETE, &(store_response){.id = key, .uid = uid});
        json_object *o = json_object_new_object();
        if (o) {
            json_object_object_add(o, "id", json_object_new_string(key));
            json_object_object_add(o, "object", json_object_new_string("response"));
            json_object_object_add(o, "deleted", json_object_new_boolean(1));
        }
        http_send_json(h, wc, r, 200, o);
        return;
    }
    if (r == R_RESPONSE) {
        httpwire_add_header(wc, "Content-Type", "application/json");
        httpwire_reply(wc, 200, e.response, e.response_len);
        http_count_status(h, r, 200);
        return;
    }
    json_object *list = json_tokener_parse(e.items);
    if (!json_object_is_type(list, json_type_array)) {
        json_object_put(list);
        http_send_json(h, wc, r, 500, NULL);
        return;
    }
    send_items(h, wc, list, uri[plen] == '?' ? uri + plen + 1 : "");
    json_object_put(list);
}
