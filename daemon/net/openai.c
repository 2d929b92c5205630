/*
 * openai.c — the JSON of the OpenAI API for the gateway (http.h): each route's request body
 * read into the native request it becomes, each native answer written as OpenAI's object
 * or as Server-Sent Events, errors in OpenAI's shape, and the model list.
 */
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/net/fimreq.h"
#include "daemon/net/http_internal.h"
#include "daemon/net/jsonfield.h"
#include "daemon/net/llamaparams.h"
#include "engine/jsonesc.h"
#include "engine/model/logprob.h"
#include "engine/tok/chatharmony.h"
#include "engine/tok/stop.h"
#include "engine/tok/utf8.h"
#include "proto/frame.h"

/* ---- errors ---- */

void openai_map_error(Llms__ErrorCode c, int *status, const char **type, const char **code)
{
    *type = "server_error";
    switch (c) {
    case LLMS__ERROR_CODE__INVALID_ARGUMENT:
        *status = 400, *type = "invalid_request_error", *code = "invalid_argument";
        break;
    case LLMS__ERROR_CODE__NOT_FOUND:
        *status = 404, *type = "invalid_request_error", *code = "not_found";
        break;
    case LLMS__ERROR_CODE__PERMISSION_DENIED:
        *status = 403, *type = "permission_error", *code = "permission_denied";
        break;
    case LLMS__ERROR_CODE__RESOURCE_EXHAUSTED:
        *status = 429, *type = "rate_limit_error", *code = "resource_exhausted";
        break;
    case LLMS__ERROR_CODE__FAILED_PRECONDITION:
        *status = 409, *type = "invalid_request_error", *code = "failed_precondition";
        break;
    case LLMS__ERROR_CODE__UNAVAILABLE:
        *status = 503, *code = "unavailable";
        break;
    case LLMS__ERROR_CODE__UNIMPLEMENTED:
        *status = 501, *code = "unimplemented";
        break;
    case LLMS__ERROR_CODE__DEADLINE_EXCEEDED:
        *status = 504, *code = "deadline_exceeded";
        break;
    case LLMS__ERROR_CODE__CANCELLED:
        *status = 500, *code = "cancelled";
        break;
    default:
        *status = 500, *code = "internal_error";
        break;
    }
}

static const char *stop_name(Llms__StopReason r)
{
    switch (r) {
    case LLMS__STOP_REASON__STOP_EOS: return "eos";
    case LLMS__STOP_REASON__STOP_MAX_TOKENS: return "max_tokens";
    case LLMS__STOP_REASON__STOP_STRING: return "stop_string";
    case LLMS__STOP_REASON__STOP_CONTEXT_FULL: return "context_full";
    case LLMS__STOP_REASON__STOP_CANCELLED: return "cancelled";
    case LLMS__STOP_REASON__STOP_DEADLINE: return "deadline";
    case LLMS__STOP_REASON__STOP_SHUTDOWN: return "shutdown";
    default: return "unknown";
    }
}

const char *openai_finish_reason(Llms__StopReason r)
{
    switch (r) {
    case LLMS__STOP_REASON__STOP_EOS:
    case LLMS__STOP_REASON__STOP_STRING:
        return "stop";
    case LLMS__STOP_REASON__STOP_MAX_TOKENS:
    case LLMS__STOP_REASON__STOP_CONTEXT_FULL:
        return "length";
    default:
        return stop_name(r);
    }
}

/* OpenAI's error shape: {"error": {"message", "type", "param", "code"}}. */
void openai_send_error(http *h, httpwire_conn *wc, enum route r, int status,
                       const char *type, const char *code, const char *fmt, ...)
{
    char msg[ERR_MAX + 256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_object *e = json_object_new_object(), *o = json_object_new_object();
    if (e && o) {
        json_object_object_add(e, "message", json_object_new_string(msg));
        json_object_object_add(e, "type", json_object_new_string(type));
        json_object_object_add(e, "param", NULL);
        json_object_object_add(e, "code", json_object_new_string(code));
        json_object_object_add(o, "error", e);
        e = NULL;
    }
    json_object_put(e);
    http_send_json(h, wc, r, status, o);
}

void openai_bad_request(http *h, httpwire_conn *wc, enum route r, const char *msg)
{
    openai_send_error(h, wc, r, 400, "invalid_request_error", "invalid_request", "%s", msg);
}

/* ---- answers ---- */

static void evbuffer_put(void *b, const char *bytes, size_t n)
{
    evbuffer_add(b, bytes, n);
}

void openai_add_escaped(struct evbuffer *b, const char *s, size_t n)
{
    jsonesc_write(s, n, evbuffer_put, b);
}

void openai_finish_error(hreq *hr, Llms__ErrorCode code, const char *msg)
{
    int status;
    const char *type, *ecode;
    openai_map_error(code, &status, &type, &ecode);
    http_req_finish(hr);
    if (!hr->started) {
        openai_send_error(hr->h, hr->wc, hr->route, status, type, ecode, "%s", msg);
        return;
    }
    /* The stream has begun with 200: the error is its last event. */
    json_object *e = json_object_new_object(), *o = json_object_new_object();
    if (e && o) {
        json_object_object_add(e, "message", json_object_new_string(msg));
        json_object_object_add(e, "type", json_object_new_string(type));
        json_object_object_add(e, "code", json_object_new_string(ecode));
        json_object_object_add(o, "error", e);
        e = NULL;
        evbuffer_add_printf(hr->sse, "data: %s\n\n", http_json_text(o));
    }
    json_object_put(e);
    json_object_put(o);
    evbuffer_add_printf(hr->sse, "data: [DONE]\n\n");
    httpwire_stream_chunk(hr->wc, hr->sse);
    httpwire_stream_end(hr->wc);
}

/* The JSON object every chunk and reply of a generation starts with. */
static json_object *gen_head(hreq *hr, const char *object)
{
    json_object *o = json_object_new_object();
    if (!o)
        return NULL;
    json_object_object_add(o, "id", json_object_new_string(hr->id));
    json_object_object_add(o, "object", json_object_new_string(object));
    json_object_object_add(o, "created", json_object_new_int64(hr->created));
    json_object_object_add(o, "model", json_object_new_string(hr->model));
    return o;
}

static bool is_chat(const hreq *hr)
{
    return hr->route == R_CHAT;
}

/* ---- logprobs ---- */

json_object *openai_piece_text(const ProtobufCBinaryData *piece, bool cut_end_kept)
{
    char out[UTF8_OUT_CAP(256) + 1];
    size_t n = piece->len < 256 ? piece->len : 256;
    utf8_stream u = {0};
    size_t len = utf8_stream_feed(&u, (const char *)piece->data, n, out);
    if (cut_end_kept)
        len += utf8_stream_flush(&u, out + len);
    return json_object_new_string_len(out, (int)len);
}

/* A token's text as OpenAI gives it: a character cut at its end as U+FFFD. */
static json_object *piece_string(const ProtobufCBinaryData *piece)
{
    return openai_piece_text(piece, true);
}

json_object *openai_piece_bytes(const ProtobufCBinaryData *piece)
{
    json_object *a = json_object_new_array_ext((int)piece->len);
    for (size_t i = 0; a && i < piece->len; i++)
        json_object_array_add(a, json_object_new_int(piece->data[i]));
    return a;
}

/* OpenAI writes -9999.0 for a token the model gave no probability: JSON has no
 * infinity. */
static json_object *logprob_number(float lp)
{
    return json_object_new_double(isfinite(lp) ? (double)lp : -9999.0);
}

/* A chat's {"token", "logprob", "bytes"} of one token. */
static json_object *chat_token_entry(const Llms__TokenLogprob *t)
{
    json_object *e = json_object_new_object();
    if (e) {
        json_object_object_add(e, "token", piece_string(&t->piece));
        json_object_object_add(e, "logprob", logprob_number(t->logprob));
        json_object_object_add(e, "bytes", openai_piece_bytes(&t->piece));
    }
    return e;
}

/* Characters a piece adds to the text (its bytes that begin one). */
static size_t piece_chars(const ProtobufCBinaryData *piece)
{
    size_t n = 0;
    for (size_t i = 0; i < piece->len; i++)
        n += (piece->data[i] & 0xC0) != 0x80;
    return n;
}

void openai_logprobs_add(hreq *hr, unsigned i, Llms__TokenLogprob *const *lps, size_t n)
{
    if (!hr->logprobs || n == 0)
        return;
    bool chat = hr->route == R_CHAT;
    gen_choice *c = &hr->choices[i];
    json_object *content, *tokens, *token_lps, *tops, *offsets;
    if (!c->lp) {
        /* chat: {"content": [...], "refusal": null}; a completion: four parallel lists */
        if (!(c->lp = json_object_new_object()))
            return;
        if (chat) {
            json_object_object_add(c->lp, "content", json_object_new_array());
            json_object_object_add(c->lp, "refusal", NULL);
        } else {
            json_object_object_add(c->lp, "tokens", json_object_new_array());
            json_object_object_add(c->lp, "token_logprobs", json_object_new_array());
            json_object_object_add(c->lp, "top_logprobs", json_object_new_array());
            json_object_object_add(c->lp, "text_offset", json_object_new_array());
        }
    }
    for (size_t j = 0; j < n; j++) {
        const Llms__TokenLogprob *t = lps[j];
        if (chat) {
            json_object *e = chat_token_entry(t), *top = json_object_new_array();
            for (size_t k = 0; k < t->n_top; k++)
                json_object_array_add(top, chat_token_entry(t->top[k]));
            json_object_object_add(e, "top_logprobs", top);
            if (json_object_object_get_ex(c->lp, "content", &content))
                json_object_array_add(content, e);
            continue;
        }
        json_object *top = json_object_new_object();
        for (size_t k = 0; top && k < t->n_top; k++) {
            json_object *s = piece_string(&t->top[k]->piece);
            const char *key = s ? json_object_get_string(s) : "";
            /* two tokens of one text (a byte token's U+FFFD) keep the likelier */
            if (!json_object_object_get_ex(top, key, NULL))
                json_object_object_add(top, key, logprob_number(t->top[k]->logprob));
            json_object_put(s);
        }
        if (json_object_object_get_ex(c->lp, "tokens", &tokens) &&
            json_object_object_get_ex(c->lp, "token_logprobs", &token_lps) &&
            json_object_object_get_ex(c->lp, "top_logprobs", &tops) &&
            json_object_object_get_ex(c->lp, "text_offset", &offsets)) {
            json_object_array_add(tokens, piece_string(&t->piece));
            json_object_array_add(token_lps, logprob_number(t->logprob));
            json_object_array_add(tops, top);
            json_object_array_add(offsets, json_object_new_int64((int64_t)c->lp_chars));
        } else {
            json_object_put(top);
        }
        c->lp_chars += piece_chars(&t->piece);
    }
}

/* The "logprobs" member of choice i: those it holds (taken), or null. */
static json_object *take_logprobs(hreq *hr, unsigned i)
{
    json_object *o = hr->choices[i].lp;
    hr->choices[i].lp = NULL;
    return o;
}

/* Begins the SSE reply: headers, then for chat the assistant role of each choice. */
int openai_sse_start(hreq *hr)
{
    if (hr->started)
        return 0;
    json_object *o = gen_head(hr, is_chat(hr) ? "chat.completion.chunk" : "text_completion");
    const char *s = o ? http_json_text(o) : NULL;
    size_t n = s ? strlen(s) : 0;
    const char *tail = ",\"choices\":[{\"index\":";
    hr->prefix = n ? malloc(6 + n + strlen(tail)) : NULL;
    if (!hr->prefix) {
        json_object_put(o);
        return -1;
    }
    /* s ends with '}': the object stays open for its choices. */
    sprintf(hr->prefix, "data: %.*s%s", (int)(n - 1), s, tail);
    json_object_put(o);
    httpwire_add_header(hr->wc, "Content-Type", "text/event-stream");
    httpwire_add_header(hr->wc, "Cache-Control", "no-cache");
    httpwire_stream_start(hr->wc, 200);
    http_count_status(hr->h, hr->route, 200);
    hr->started = true;
    if (is_chat(hr)) {
        for (unsigned i = 0; i < hr->n_choices; i++)
            evbuffer_add_printf(hr->sse, "%s%u,\"delta\":{\"role\":\"assistant\",\"content\":"
                                         "\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n",
                                hr->prefix, i);
        httpwire_stream_chunk(hr->wc, hr->sse);
    }
    return 0;
}

/* One SSE event of choice i with a piece of text under key ("content", or a chat's
 * "reasoning_content") and, at its end, the finish reason. */
static void sse_delta(hreq *hr, unsigned i, const char *key, const char *text, size_t n,
                      const char *finish)
{
    struct evbuffer *b = hr->sse;
    evbuffer_add(b, hr->prefix, strlen(hr->prefix));
    evbuffer_add_printf(b, "%u,", i);
    if (is_chat(hr)) {
        if (n || !finish) {
            evbuffer_add_printf(b, "\"delta\":{\"%s\":\"", key);
            openai_add_escaped(b, text, n);
            evbuffer_add(b, "\"}", 2);
        } else {
            evbuffer_add(b, "\"delta\":{}", 10);
        }
    } else {
        evbuffer_add(b, "\"text\":\"", 8);
        openai_add_escaped(b, text, n);
        evbuffer_add(b, "\"", 1);
    }
    json_object *lp = take_logprobs(hr, i);
    evbuffer_add_printf(b, ",\"logprobs\":%s", lp ? http_json_text(lp) : "null");
    json_object_put(lp);
    if (finish)
        evbuffer_add_printf(b, ",\"finish_reason\":\"%s\"}]}\n\n", finish);
    else
        evbuffer_add_printf(b, ",\"finish_reason\":null}]}\n\n");
    httpwire_stream_chunk(hr->wc, b);
}

void openai_sse_text(hreq *hr, unsigned i, const char *text, size_t n, const char *finish)
{
    sse_delta(hr, i, "content", text, n, finish);
    hr->choices[i].sent += n;
}

/* A call as an entry of OpenAI's tool_calls (index >= 0: a streamed delta's). */
static json_object *tool_call_entry(json_object *call, int index)
{
    json_object *e = json_object_new_object(), *fn = json_object_new_object(), *v;
    if (!e || !fn) {
        json_object_put(e);
        json_object_put(fn);
        return NULL;
    }
    if (index >= 0)
        json_object_object_add(e, "index", json_object_new_int(index));
    if (json_object_object_get_ex(call, "id", &v))
        json_object_object_add(e, "id", json_object_get(v));
    json_object_object_add(e, "type", json_object_new_string("function"));
    if (json_object_object_get_ex(call, "name", &v))
        json_object_object_add(fn, "name", json_object_get(v));
    json_object_object_add(fn, "arguments", json_object_new_string(toolcall_arguments_text(call)));
    json_object_object_add(e, "function", fn);
    return e;
}

/* One SSE event whose delta holds the calls (the first of them the reply's first_index-th). */
static void sse_tool_calls(hreq *hr, json_object *calls, size_t first_index)
{
    json_object *delta = json_object_new_object(), *list = json_object_new_array();
    for (size_t i = 0; delta && list && i < json_object_array_length(calls); i++)
        json_object_array_add(list, tool_call_entry(json_object_array_get_idx(calls, i),
                                                    (int)(first_index + i)));
    if (!delta || !list) {
        json_object_put(delta);
        json_object_put(list);
        return;
    }
    json_object_object_add(delta, "tool_calls", list);
    evbuffer_add_printf(hr->sse, "%s0,\"delta\":%s,\"logprobs\":null,\"finish_reason\":null}]}\n\n",
                        hr->prefix, http_json_text(delta));
    json_object_put(delta);
    httpwire_stream_chunk(hr->wc, hr->sse);
}

/* Feeds n bytes of reply (end: the last) to hr's scan and streams what it decides (a
 * request with tools has one choice). -1 out of memory. */
static int sse_scanned(hreq *hr, const char *text, size_t n, bool end)
{
    size_t before = toolcall_scan_calls(hr->scan);
    toolcall_out out;
    int rc = toolcall_scan_feed(hr->scan, text, n, end, &out);
    if (rc == 0 && out.content_len)
        openai_sse_text(hr, 0, out.content, out.content_len, NULL);
    if (rc == 0 && json_object_array_length(out.calls))
        sse_tool_calls(hr, out.calls, before);
    toolcall_out_free(&out);
    return rc;
}

/* A choice's run of reasoning or content, for the split. */
typedef struct sse_choice {
    hreq *hr;
    unsigned i;
} sse_choice;

static int sse_run(void *arg, bool reasoning, const char *text, size_t n)
{
    sse_choice *c = arg;
    if (reasoning)
        sse_delta(c->hr, c->i, "reasoning_content", text, n, NULL);
    else if (!c->hr->scan)
        openai_sse_text(c->hr, c->i, text, n, NULL);
    else
        return sse_scanned(c->hr, text, n, false);
    return 0;
}

/* Feeds n bytes of choice i's reply (end: the last) to its split: the reasoning goes out
 * as reasoning_content deltas, the content as ever (through the scan, when there is one,
 * which decides what it held back once the reply is over). -1 out of memory. */
static int sse_reasoned(hreq *hr, unsigned i, const char *text, size_t n, bool end)
{
    sse_choice c = {hr, i};
    if (reasoning_feed_each(&hr->choices[i].split, text, n, end, sse_run, &c) < 0)
        return -1;
    return end && hr->scan ? sse_scanned(hr, "", 0, true) : 0;
}

void openai_sse_piece(hreq *hr, unsigned i, const char *text, size_t n)
{
    if (!hr->scan && !hr->reasoning) {
        openai_sse_text(hr, i, text, n, NULL);
        return;
    }
    if ((hr->reasoning ? sse_reasoned(hr, i, text, n, false) : sse_scanned(hr, text, n, false)) < 0)
        openai_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
}

/* OpenAI's usage: cached counts the prompt tokens whose KV was reused rather than
 * evaluated (the prompt cache's, a RAG answer's QKV tree's), in the shape OpenAI and vLLM
 * give them. */
static json_object *usage_obj(uint32_t prompt, uint32_t cached, uint32_t gen)
{
    json_object *u = json_object_new_object(), *details = json_object_new_object();
    if (u && details) {
        json_object_object_add(u, "prompt_tokens", json_object_new_int64(prompt));
        json_object_object_add(u, "completion_tokens", json_object_new_int64(gen));
        json_object_object_add(u, "total_tokens", json_object_new_int64((int64_t)prompt + gen));
        json_object_object_add(details, "cached_tokens", json_object_new_int64(cached));
        json_object_object_add(u, "prompt_tokens_details", details);
        details = NULL;
    }
    json_object_put(details);
    return u;
}

/* The "llmsd" object: why each choice stopped (one choice: "stop_reason"; several:
 * "stop_reasons" by index) and the times of the whole, each the longest of its choices'
 * (they run side by side). */
json_object *openai_llmsd_obj(const hreq *hr)
{
    json_object *x = json_object_new_object();
    if (!x)
        return NULL;
    const Llms__CallResult *first = hr->choices[0].result->result;
    double queue_ms = 0, prefill_ms = 0, decode_ms = 0;
    json_object *reasons = hr->n_choices > 1 ? json_object_new_array() : NULL;
    for (unsigned i = 0; i < hr->n_choices; i++) {
        const Llms__CallResult *res = hr->choices[i].result->result;
        queue_ms = fmax(queue_ms, res->queue_ms);
        prefill_ms = fmax(prefill_ms, res->prefill_ms);
        decode_ms = fmax(decode_ms, res->decode_ms);
        if (reasons)
            json_object_array_add(reasons, json_object_new_string(stop_name(res->stop_reason)));
    }
    if (reasons)
        json_object_object_add(x, "stop_reasons", reasons);
    else
        json_object_object_add(x, "stop_reason",
                               json_object_new_string(stop_name(first->stop_reason)));
    json_object_object_add(x, "queue_ms", json_object_new_double(queue_ms));
    json_object_object_add(x, "prefill_ms", json_object_new_double(prefill_ms));
    json_object_object_add(x, "decode_ms", json_object_new_double(decode_ms));
    if (hr->context_id) {
        json_object_object_add(x, "context", json_object_new_string(hr->context_id));
        json_object_object_add(x, "context_tokens", json_object_new_int64(first->context_tokens));
    }
    return x;
}

/* A chat's reply as OpenAI's message: its text, or with tools read for calls the text
 * around them (null when there is none) and "tool_calls", *fin then "tool_calls"; a
 * thinking model's reasoning apart as "reasoning_content" (none when it has none), its
 * calls read in the content alone. NULL out of memory. */
static json_object *chat_message(hreq *hr, const char *text, const char **fin)
{
    json_object *m = json_object_new_object();
    toolcall_out out = {0};
    reasoning_span r, c;
    if (!m || openai_split_whole(hr, text, &r, &c) < 0 ||
        (hr->scan && toolcall_scan_feed(hr->scan, c.text, c.n, true, &out) < 0)) {
        json_object_put(m);
        toolcall_out_free(&out);
        return NULL;
    }
    json_object_object_add(m, "role", json_object_new_string("assistant"));
    size_t n_calls = out.calls ? json_object_array_length(out.calls) : 0;
    if (!hr->scan)
        json_object_object_add(m, "content", json_object_new_string_len(c.text, (int)c.n));
    else if (out.content_len || n_calls == 0)
        json_object_object_add(m, "content",
                               json_object_new_string_len(out.content ? out.content : "",
                                                          (int)out.content_len));
    else
        json_object_object_add(m, "content", NULL);
    if (r.n)
        json_object_object_add(m, "reasoning_content",
                               json_object_new_string_len(r.text, (int)r.n));
    if (n_calls) {
        json_object *list = json_object_new_array();
        for (size_t i = 0; list && i < n_calls; i++)
            json_object_array_add(list, tool_call_entry(json_object_array_get_idx(out.calls, i), -1));
        json_object_object_add(m, "tool_calls", list);
        *fin = "tool_calls";
    }
    toolcall_out_free(&out);
    return m;
}

/* How a choice ended: its whole text, why it stopped, the logprobs of its tokens. */
typedef struct choice_end {
    const char *text;
    Llms__StopReason stop;
    Llms__TokenLogprob *const *lps;
    size_t n_lps;
} choice_end;

/* The last SSE event of choice i: the text (and logprobs) of chunks dropped for a slow
 * reader, none otherwise, and its finish_reason. 0, or -1 after ending hr (out of
 * memory). */
static int stream_choice_end(hreq *hr, unsigned i, const choice_end *e)
{
    if (openai_sse_start(hr)) {
        openai_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return -1;
    }
    const gen_choice *c = &hr->choices[i];
    size_t len = strlen(e->text);
    size_t from = c->sent < len ? c->sent : len;
    if (c->lp_seen < e->n_lps)
        openai_logprobs_add(hr, i, e->lps + c->lp_seen, e->n_lps - c->lp_seen);
    const char *fin = openai_finish_reason(e->stop);
    if (hr->reasoning) {
        /* what the split and the scan hold back is decided now; the finish event has no
         * text */
        size_t fed = reasoning_fed(&c->split);
        from = fed < len ? fed : len;
        if (sse_reasoned(hr, i, e->text + from, len - from, true) < 0) {
            openai_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
            return -1;
        }
        from = len;
        if (hr->scan && toolcall_scan_calls(hr->scan))
            fin = "tool_calls";
    } else if (hr->scan) {
        /* what the scan holds back is decided now; the finish event has no text */
        from = toolcall_scan_fed(hr->scan) < len ? toolcall_scan_fed(hr->scan) : len;
        if (sse_scanned(hr, e->text + from, len - from, true) < 0) {
            openai_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
            return -1;
        }
        from = len;
        if (toolcall_scan_calls(hr->scan))
            fin = "tool_calls";
    }
    openai_sse_text(hr, i, e->text + from, len - from, fin);
    return 0;
}

/* The end of a stream whose choices have all ended: the usage event, then [DONE]. */
static void stream_end(hreq *hr, json_object *usage, json_object *extra)
{
    /* A RAG answer's outcome and passages come in this last event whether or not usage
     * was asked for: they are what the route is for. */
    if (hr->include_usage || hr->route == R_RAG) {
        json_object *o = gen_head(hr, is_chat(hr) ? "chat.completion.chunk" : "text_completion");
        if (o) {
            json_object_object_add(o, "choices", json_object_new_array());
            json_object_object_add(o, "usage", usage);
            json_object_object_add(o, "llmsd", extra);
            usage = extra = NULL;
            evbuffer_add_printf(hr->sse, "data: %s\n\n", http_json_text(o));
            json_object_put(o);
        }
    }
    json_object_put(usage);
    json_object_put(extra);
    evbuffer_add_printf(hr->sse, "data: [DONE]\n\n");
    httpwire_stream_chunk(hr->wc, hr->sse);
    httpwire_stream_end(hr->wc);
}

/* The whole reply: its choices as ends say (hr->n_choices of them), usage and extra. */
static void reply_whole(hreq *hr, const choice_end *ends, json_object *usage, json_object *extra)
{
    json_object *o = gen_head(hr, is_chat(hr) ? "chat.completion" : "text_completion");
    json_object *choices = json_object_new_array();
    if (!o || !choices) {
        json_object_put(choices);
        json_object_put(o);
        json_object_put(usage);
        json_object_put(extra);
        openai_send_error(hr->h, hr->wc, hr->route, 500, "server_error", "internal_error",
                          "out of memory");
        return;
    }
    for (unsigned i = 0; i < hr->n_choices; i++) {
        json_object *c = json_object_new_object();
        if (!c)
            continue;
        json_object_object_add(c, "index", json_object_new_int((int)i));
        const char *fin = openai_finish_reason(ends[i].stop);
        if (is_chat(hr)) {
            json_object_object_add(c, "message", chat_message(hr, ends[i].text, &fin));
        } else {
            json_object_object_add(c, "text", json_object_new_string(ends[i].text));
        }
        openai_logprobs_add(hr, i, ends[i].lps, ends[i].n_lps);
        json_object_object_add(c, "logprobs", take_logprobs(hr, i));
        json_object_object_add(c, "finish_reason", json_object_new_string(fin));
        json_object_array_add(choices, c);
    }
    json_object_object_add(o, "choices", choices);
    json_object_object_add(o, "usage", usage);
    json_object_object_add(o, "llmsd", extra);
    http_send_json(hr->h, hr->wc, hr->route, 200, o);
}

/* The final reply of a generation (a completion, a chat turn, a RAG answer) whose choices
 * have all ended as ends say: a stream's end (each choice's last event has gone), or the
 * whole object. Usage counts the prompt once and the choices' tokens together, as
 * OpenAI's does; extra is its "llmsd" object (taken over, may be NULL). */
static void reply_generation(hreq *hr, const choice_end *ends, uint32_t prompt_tokens,
                             uint32_t cached_tokens, uint32_t generated_tokens,
                             json_object *extra)
{
    http_req_finish(hr);
    json_object *usage = usage_obj(prompt_tokens, cached_tokens, generated_tokens);
    if (hr->stream)
        stream_end(hr, usage, extra);
    else
        reply_whole(hr, ends, usage, extra);
}

static choice_end end_of(const Llms__CallResult *res)
{
    return (choice_end){res->text, res->stop_reason, res->logprobs, res->n_logprobs};
}

void openai_on_result(hreq *hr, unsigned i, Llms__Response *r)
{
    gen_choice *c = &hr->choices[i];
    if (c->result) {
        frame_free_response(r);
        openai_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "two results of one choice");
        return;
    }
    c->result = r;
    hr->n_ended++;
    hr->h->prompt_tokens += r->result->prompt_tokens;
    hr->h->cached_tokens += r->result->has_cached_tokens ? r->result->cached_tokens : 0;
    hr->h->completion_tokens += r->result->generated_tokens;
    /* a stream ends each choice as it ends; the answer waits for them all */
    choice_end ends[HTTP_CHOICES_MAX];
    ends[i] = end_of(r->result);
    if (hr->stream && stream_choice_end(hr, i, &ends[i]))
        return;
    if (hr->n_ended < hr->n_choices)
        return;
    uint32_t generated = 0;
    for (unsigned k = 0; k < hr->n_choices; k++) {
        ends[k] = end_of(hr->choices[k].result->result);
        generated += hr->choices[k].result->result->generated_tokens;
    }
    const Llms__CallResult *first = hr->choices[0].result->result;
    reply_generation(hr, ends, first->prompt_tokens,
                     first->has_cached_tokens ? first->cached_tokens : 0, generated,
                     openai_llmsd_obj(hr));
}

static const char *rag_outcome_name(Llms__RagOutcome o)
{
    switch (o) {
    case LLMS__RAG_OUTCOME__RAG_QA_HIT:
        return "qa_hit";
    case LLMS__RAG_OUTCOME__RAG_QKV_HIT:
        return "qkv_hit";
    default:
        return "miss";
    }
}

/* A RAG answer: as a completion, with the cache outcome, the passages used and the
 * latency breakdown in its "llmsd" object. */
void openai_on_rag_result(hreq *hr, const Llms__RagResult *res)
{
    json_object *x = json_object_new_object(), *ps = json_object_new_array();
    if (x && ps) {
        json_object_object_add(x, "stop_reason",
                               json_object_new_string(stop_name(res->stop_reason)));
        json_object_object_add(x, "outcome",
                               json_object_new_string(rag_outcome_name(res->outcome)));
        json_object_object_add(x, "reused_tokens", json_object_new_int64(res->reused_tokens));
        json_object_object_add(x, "reused_passages",
                               json_object_new_int64(res->reused_passages));
        if (res->has_qa_similarity)
            json_object_object_add(x, "qa_similarity",
                                   json_object_new_double(res->qa_similarity));
        json_object_object_add(x, "queue_ms", json_object_new_double(res->queue_ms));
        json_object_object_add(x, "retrieve_ms", json_object_new_double(res->retrieve_ms));
        json_object_object_add(x, "prefill_ms", json_object_new_double(res->prefill_ms));
        json_object_object_add(x, "decode_ms", json_object_new_double(res->decode_ms));
        for (size_t i = 0; i < res->n_passages; i++) {
            const Llms__KbHit *k = res->passages[i];
            json_object *e = json_object_new_object();
            if (!e)
                continue;
            json_object_object_add(e, "passage", json_object_new_int64((int64_t)k->passage));
            json_object_object_add(e, "document", json_object_new_string(k->document));
            json_object_object_add(e, "seq", json_object_new_int64(k->seq));
            json_object_object_add(e, "score", json_object_new_double(k->score));
            json_object_array_add(ps, e);
        }
        json_object_object_add(x, "passages", ps);
        ps = NULL;
    }
    json_object_put(ps);
    hr->h->prompt_tokens += res->prompt_tokens;
    hr->h->completion_tokens += res->generated_tokens;
    choice_end e = {res->text, res->stop_reason, NULL, 0};
    if (hr->stream && stream_choice_end(hr, 0, &e)) {
        json_object_put(x);
        return;
    }
    reply_generation(hr, &e, res->prompt_tokens, res->reused_tokens, res->generated_tokens, x);
}

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* The vector as little-endian float32 bytes in base64 (what OpenAI's encoding_format
 * "base64" sends). Fresh string. */
static char *vector_base64(const float *v, size_t n)
{
    size_t bytes = n * 4;
    char *out = malloc((bytes + 2) / 3 * 4 + 1);
    if (!out)
        return NULL;
    uint8_t in[3];
    size_t k = 0, o = 0;
    for (size_t i = 0; i < bytes; i++) {
        uint32_t bits;
        memcpy(&bits, &v[i / 4], 4);
        in[k++] = (uint8_t)(bits >> (8 * (i % 4)));
        if (k == 3 || i == bytes - 1) {
            uint32_t w = (uint32_t)in[0] << 16 | (k > 1 ? (uint32_t)in[1] << 8 : 0) |
                         (k > 2 ? in[2] : 0);
            out[o++] = b64[w >> 18 & 63];
            out[o++] = b64[w >> 12 & 63];
            out[o++] = k > 1 ? b64[w >> 6 & 63] : '=';
            out[o++] = k > 2 ? b64[w & 63] : '=';
            k = 0;
        }
    }
    out[o] = '\0';
    return out;
}

void openai_on_embed(hreq *hr, const Llms__EmbedResponse *e)
{
    http *h = hr->h;
    http_req_finish(hr);
    /* cutting vectors short is right for models trained so only */
    char msg[MODELS_NAME_MAX + 160];
    if (http_embed_dimensions_differ(hr, e, msg, sizeof msg)) {
        openai_send_error(h, hr->wc, hr->route, 400, "invalid_request_error", "invalid_argument",
                          "%s", msg);
        return;
    }
    json_object *o = json_object_new_object(), *data = json_object_new_array();
    if (!o || !data) {
        json_object_put(o);
        json_object_put(data);
        openai_send_error(h, hr->wc, hr->route, 500, "server_error", "internal_error",
                          "out of memory");
        return;
    }
    uint64_t tokens = 0;
    for (size_t i = 0; i < e->n_vectors; i++) {
        const Llms__Vector *v = e->vectors[i];
        json_object *item = json_object_new_object(), *emb;
        if (hr->base64) {
            char *s = vector_base64(v->values, v->n_values);
            emb = s ? json_object_new_string(s) : NULL;
            free(s);
        } else {
            emb = http_vector_json(v);
        }
        json_object_object_add(item, "object", json_object_new_string("embedding"));
        json_object_object_add(item, "index", json_object_new_int((int)i));
        json_object_object_add(item, "embedding", emb);
        json_object_array_add(data, item);
        if (i < e->n_n_tokens)
            tokens += e->n_tokens[i];
    }
    h->embed_tokens += tokens;
    json_object_object_add(o, "object", json_object_new_string("list"));
    json_object_object_add(o, "data", data);
    json_object_object_add(o, "model", json_object_new_string(hr->model));
    json_object *u = json_object_new_object();
    json_object_object_add(u, "prompt_tokens", json_object_new_int64((int64_t)tokens));
    json_object_object_add(u, "total_tokens", json_object_new_int64((int64_t)tokens));
    json_object_object_add(o, "usage", u);
    http_send_json(h, hr->wc, hr->route, 200, o);
}

/* The text of documents[i] of the request (a string or {"text": ...}). */
static const char *document_text(json_object *docs, size_t i)
{
    json_object *d = json_object_array_get_idx(docs, i), *t;
    if (json_object_is_type(d, json_type_object) && json_object_object_get_ex(d, "text", &t))
        d = t;
    return json_object_get_string(d);
}

/* The answer in Jina's shape ({"results": [{index, relevance_score, document?}]}), or in
 * TEI's for a request in its form ([{index, score, text?}]); either way best first. */
void openai_on_rerank(hreq *hr, const Llms__RerankResponse *rr)
{
    http *h = hr->h;
    http_req_finish(hr);
    json_object *o = hr->tei ? NULL : json_object_new_object(), *results = json_object_new_array(),
                *docs = NULL;
    if ((!o && !hr->tei) || !results) {
        json_object_put(o);
        json_object_put(results);
        openai_send_error(h, hr->wc, hr->route, 500, "server_error", "internal_error",
                          "out of memory");
        return;
    }
    json_object_object_get_ex(hr->body, hr->tei ? "texts" : "documents", &docs);
    for (size_t i = 0; i < rr->n_hits; i++) {
        json_object *item = json_object_new_object();
        float s = rr->hits[i]->score;
        const char *text = docs ? document_text(docs, rr->hits[i]->index) : NULL;
        json_object_object_add(item, "index", json_object_new_int((int)rr->hits[i]->index));
        json_object_object_add(item, hr->tei ? "score" : "relevance_score",
                               isnan(s) ? NULL : json_object_new_double(s));
        if (hr->return_documents && text && hr->tei) {
            json_object_object_add(item, "text", json_object_new_string(text));
        } else if (hr->return_documents && text) {
            json_object *d = json_object_new_object();
            json_object_object_add(d, "text", json_object_new_string(text));
            json_object_object_add(item, "document", d);
        }
        json_object_array_add(results, item);
    }
    if (hr->tei) {
        http_send_json(h, hr->wc, hr->route, 200, results);
        return;
    }
    json_object_object_add(o, "object", json_object_new_string("list"));
    json_object_object_add(o, "model", json_object_new_string(hr->model));
    json_object_object_add(o, "results", results);
    http_send_json(h, hr->wc, hr->route, 200, o);
}

/* ---- reading requests ---- */

/* jsonfield_get() of a positive integer that fits a uint32 into *out: 0 absent (or null), 1 read,
 * -1 with msg when it is another type or out of range. */
static int positive_u32_field(json_object *o, const char *key, uint32_t *out, char *msg,
                              size_t cap)
{
    json_object *v;
    int rc = jsonfield_get(o, key, "", json_type_int, &v, msg, cap);
    if (rc <= 0)
        return rc;
    int64_t x = json_object_get_int64(v);
    if (x < 1 || x > UINT32_MAX) {
        snprintf(msg, cap, "'%s' must be a positive integer", key);
        return -1;
    }
    *out = (uint32_t)x;
    return 1;
}

/* OpenAI's response_format into p: {"type": "text"} (or null) is free text,
 * {"type": "json_object"} JSON mode, {"type": "json_schema", "json_schema": {"schema":
 * {...}}} JSON mode following the schema (name, description and strict are read past:
 * the schema is always enforced); llama.cpp's {"type": "json_object", "schema": {...}}
 * too. *schema is the schema given, or NULL. 0, or -1 with msg. */
static int read_response_format(json_object *body, Llms__GenerationParams *p,
                                json_object **schema, char *msg, size_t cap)
{
    json_object *v, *type, *inner;
    *schema = NULL;
    if (!json_object_object_get_ex(body, "response_format", &v) ||
        json_object_is_type(v, json_type_null))
        return 0;
    const char *name = json_object_is_type(v, json_type_object) &&
                               json_object_object_get_ex(v, "type", &type) &&
                               json_object_is_type(type, json_type_string)
                           ? json_object_get_string(type)
                           : "";
    if (strcmp(name, "json_schema") == 0) {
        if (!json_object_object_get_ex(v, "json_schema", &inner) ||
            !json_object_is_type(inner, json_type_object) ||
            !json_object_object_get_ex(inner, "schema", schema) ||
            !json_object_is_type(*schema, json_type_object)) {
            snprintf(msg, cap, "'response_format.json_schema.schema': a JSON Schema object is "
                               "required");
            return -1;
        }
    } else if (strcmp(name, "json_object") == 0 && json_object_object_get_ex(v, "schema", &inner) &&
               !json_object_is_type(inner, json_type_null)) {
        if (!json_object_is_type(inner, json_type_object)) {
            snprintf(msg, cap, "'response_format.schema': not a JSON Schema object");
            return -1;
        }
        *schema = inner;
    } else if (strcmp(name, "text") != 0 && strcmp(name, "json_object") != 0) {
        snprintf(msg, cap, "'response_format': the type is one of \"text\", \"json_object\" "
                           "and \"json_schema\"");
        return -1;
    }
    p->has_format = 1;
    p->format = strcmp(name, "text") == 0 ? LLMS__RESPONSE_FORMAT__FORMAT_TEXT
                                          : LLMS__RESPONSE_FORMAT__FORMAT_JSON_OBJECT;
    return 0;
}

int openai_read_format(json_object *body, Llms__GenerationParams *p, char *msg, size_t cap)
{
    json_object *schema, *v;
    if (read_response_format(body, p, &schema, msg, cap))
        return -1;
    bool constrained = p->has_format && p->format != LLMS__RESPONSE_FORMAT__FORMAT_TEXT;
    if (json_object_object_get_ex(body, "json_schema", &v) && !json_object_is_type(v, json_type_null)) {
        if (!json_object_is_type(v, json_type_object)) {
            snprintf(msg, cap, "'json_schema': not a JSON Schema object");
            return -1;
        }
        if (constrained) {
            snprintf(msg, cap, "'json_schema' and a JSON 'response_format': give one of them");
            return -1;
        }
        schema = v;
    }
    int rc = jsonfield_get(body, "grammar", "", json_type_string, &v, msg, cap);
    if (rc < 0)
        return -1;
    if (rc && json_object_get_string_len(v) > 0) {
        if (constrained || schema) {
            snprintf(msg, cap, "'grammar' and a JSON schema or JSON 'response_format': give one "
                               "of them");
            return -1;
        }
        p->has_format = 1;
        p->format = LLMS__RESPONSE_FORMAT__FORMAT_GRAMMAR;
        p->grammar = (char *)json_object_get_string(v);
        return 0;
    }
    if (schema) {
        p->has_format = 1;
        p->format = LLMS__RESPONSE_FORMAT__FORMAT_JSON_SCHEMA;
        /* json-c keeps the text in the object: it lives as long as body, as the request's
         * other strings do */
        p->json_schema = (char *)http_json_text(schema);
    }
    return 0;
}

/* Sampling fields of an OpenAI request into p (strings point into body; p->stop has room
 * for max_stops), with llama.cpp's beyond OpenAI's, which its server takes on these
 * routes too (their lists into *lists). */
static int read_params(json_object *body, Llms__GenerationParams *p, size_t max_stops,
                       llamaparams_lists *lists, char *msg, size_t cap)
{
    json_object *v;
    int rc;
    if (jsonfield_sampling_floats(body, "", p, msg, cap) < 0 ||
        llamaparams_read(body, p, lists, msg, cap) < 0 ||
        openai_read_format(body, p, msg, cap) < 0)
        return -1;
    if ((rc = jsonfield_get(body, "top_k", "", json_type_int, &v, msg, cap)) < 0)
        return -1;
    if (rc) {
        int64_t k = json_object_get_int64(v);
        p->has_top_k = 1, p->top_k = k < 0 ? -1 : k > INT32_MAX ? INT32_MAX : (int32_t)k;
    }
    /* vLLM's and llama.cpp's extension: generate past the end of text */
    if ((rc = jsonfield_get(body, "ignore_eos", "", json_type_boolean, &v, msg, cap)) < 0)
        return -1;
    if (rc)
        p->has_ignore_eos = 1, p->ignore_eos = json_object_get_boolean(v);
    /* OpenAI's newer name wins when it is set; a null one is absent, as every field. */
    json_object *mct;
    const char *mt = json_object_object_get_ex(body, "max_completion_tokens", &mct) &&
                             !json_object_is_type(mct, json_type_null)
                         ? "max_completion_tokens" : "max_tokens";
    if ((rc = jsonfield_get(body, mt, "", json_type_int, &v, msg, cap)) < 0)
        return -1;
    if (rc) {
        int64_t n = json_object_get_int64(v);
        p->has_max_tokens = 1, p->max_tokens = n < 0 ? 0 : n > INT32_MAX ? INT32_MAX : (int32_t)n;
    }
    if ((rc = jsonfield_get(body, "seed", "", json_type_int, &v, msg, cap)) < 0)
        return -1;
    /* A negative seed is llama.cpp's "random". */
    if (rc && json_object_get_int64(v) >= 0)
        p->has_seed = 1, p->seed = (uint64_t)json_object_get_int64(v);
    /* an llmsd extension: speculative decoding of this request */
    if ((rc = jsonfield_get(body, "speculation", "", json_type_string, &v, msg, cap)) < 0)
        return -1;
    if (rc) {
        const char *sp = json_object_get_string(v);
        static const char *const names[] = {"off", "lookup", "draft", "both"};
        static const Llms__Speculation values[] = {
            LLMS__SPECULATION__SPECULATION_OFF, LLMS__SPECULATION__SPECULATION_LOOKUP,
            LLMS__SPECULATION__SPECULATION_DRAFT, LLMS__SPECULATION__SPECULATION_BOTH};
        size_t i = 0;
        while (i < 4 && strcmp(sp, names[i]))
            i++;
        if (i == 4) {
            snprintf(msg, cap, "'speculation' must be \"off\", \"lookup\", \"draft\" or "
                               "\"both\"");
            return -1;
        }
        p->has_speculation = 1;
        p->speculation = values[i];
    }
    return jsonfield_stops(body, "stop", "", p, max_stops, msg, cap);
}

/* OpenAI's "n" into hr: how many choices (independent generations of the prompt) the
 * request asks for, 1..HTTP_CHOICES_MAX. Each choice is a request of the app's queue, so
 * n beyond what the app (or its uid) may queue could never be served; a context's
 * history takes one reply, and a RAG query has one answer. 0, or -1 with msg. */
static int read_n(hreq *hr, char *msg, size_t cap)
{
    json_object *v;
    int rc = jsonfield_get(hr->body, "n", "", json_type_int, &v, msg, cap);
    if (rc <= 0)
        return rc;
    int64_t n = json_object_get_int64(v);
    if (n < 1 || n > HTTP_CHOICES_MAX) {
        snprintf(msg, cap, "'n' must be in [1, %d]", HTTP_CHOICES_MAX);
        return -1;
    }
    if (n == 1)
        return 0;
    if (hr->context_id || hr->route == R_RAG) {
        snprintf(msg, cap, "'n' must be 1 %s", hr->context_id
                                                   ? "with 'llmsd.context': a context's history "
                                                     "takes one reply"
                                                   : "for a RAG query: it has one answer");
        return -1;
    }
    const config *cfg = hr->h->cfg;
    bool by_uid = cfg->max_queued_per_uid < cfg->max_queued_per_app;
    int queue = by_uid ? cfg->max_queued_per_uid : cfg->max_queued_per_app;
    if (n > queue) {
        snprintf(msg, cap, "'n' is %lld, but each choice is a request of its own and %s may "
                           "queue %d (%s)", (long long)n, by_uid ? "a uid" : "an app", queue,
                 by_uid ? "max_queued_per_uid" : "max_queued_per_app");
        return -1;
    }
    hr->n_choices = (unsigned)n;
    return 0;
}

bool openai_token_id(const char *key, int32_t *id)
{
    char *end;
    errno = 0;
    long v = strtol(key, &end, 10);
    if (!key[0] || *end || errno || v < 0 || v > INT32_MAX)
        return false;
    *id = (int32_t)v;
    return true;
}

/* OpenAI's logit_bias, {"token id": bias, ...}, into p (the entries live in hr). Ranges
 * are the session's to check, as for every request's params. 0, or -1 with msg. */
static int read_logit_bias(hreq *hr, Llms__GenerationParams *p, char *msg, size_t cap)
{
    json_object *o;
    int rc = jsonfield_get(hr->body, "logit_bias", "", json_type_object, &o, msg, cap);
    if (rc <= 0)
        return rc;
    size_t n = (size_t)json_object_object_length(o), i = 0;
    if (n == 0)
        return 0;
    hr->bias = calloc(n, sizeof *hr->bias);
    hr->bias_ptrs = calloc(n, sizeof *hr->bias_ptrs);
    if (!hr->bias || !hr->bias_ptrs) {
        snprintf(msg, cap, "out of memory");
        return -1;
    }
    json_object_object_foreach(o, key, value)
    {
        int32_t id;
        if (!openai_token_id(key, &id) || !(json_object_is_type(value, json_type_double) ||
                                            json_object_is_type(value, json_type_int))) {
            snprintf(msg, cap, "'logit_bias' maps token ids to numbers (\"%.32s\" is not one)",
                     key);
            return -1;
        }
        llms__token_bias__init(&hr->bias[i]);
        hr->bias[i].token = id;
        hr->bias[i].bias = (float)json_object_get_double(value);
        hr->bias_ptrs[i] = &hr->bias[i];
        i++;
    }
    p->n_logit_bias = n;
    p->logit_bias = hr->bias_ptrs;
    return 0;
}

/* OpenAI's logprobs into p and hr: a chat's "logprobs": true with "top_logprobs" (0..20)
 * alternatives, a completion's "logprobs": N (its alternatives; 0: the chosen tokens'
 * alone). A RAG answer has none to give. 0, or -1 with msg. */
static int read_logprobs(hreq *hr, Llms__GenerationParams *p, char *msg, size_t cap)
{
    json_object *v, *top;
    bool asked = json_object_object_get_ex(hr->body, "logprobs", &v) && !jsonfield_asks_nothing(v);
    bool top_asked = json_object_object_get_ex(hr->body, "top_logprobs", &top) &&
                     !json_object_is_type(top, json_type_null);
    if (hr->route == R_RAG) {
        if (!asked && !top_asked)
            return 0;
        snprintf(msg, cap, "'logprobs': a RAG answer does not give them");
        return -1;
    }
    int64_t n = 0;
    if (hr->route == R_CHAT) {
        if (asked && !json_object_is_type(v, json_type_boolean)) {
            snprintf(msg, cap, "'logprobs' must be true or false");
            return -1;
        }
        if (top_asked) {
            if (!json_object_is_type(top, json_type_int)) {
                snprintf(msg, cap, "'top_logprobs' must be an integer in [0, %d]",
                         LOGPROB_TOP_MAX);
                return -1;
            }
            n = json_object_get_int64(top);
            if (n > 0 && !asked) {
                snprintf(msg, cap, "'top_logprobs' needs 'logprobs': true");
                return -1;
            }
        }
    } else if (asked) {
        /* a count; true, which some clients send, is the chosen tokens' alone */
        if (json_object_is_type(v, json_type_int))
            n = json_object_get_int64(v);
        else if (!json_object_is_type(v, json_type_boolean)) {
            snprintf(msg, cap, "'logprobs' must be an integer in [0, %d]", LOGPROB_TOP_MAX);
            return -1;
        }
    }
    if (n < 0 || n > LOGPROB_TOP_MAX) {
        snprintf(msg, cap, "'%s' must be in [0, %d]", hr->route == R_CHAT ? "top_logprobs" :
                 "logprobs", LOGPROB_TOP_MAX);
        return -1;
    }
    if (!asked)
        return 0;
    hr->logprobs = true;
    p->has_logprobs = 1;
    p->logprobs = (int32_t)n;
    return 0;
}

/* Fields of a completion or chat that ask for what llmsd does not produce are refused,
 * naming the field: a reply that left them out would pass for one that honoured them
 * (a completion's tools, legacy functions: no tool_calls read as the model not calling).
 * Their "off" values, which clients send by default, pass. 0, or -1 with msg. */
static int refuse_unhonoured(json_object *body, bool chat, char *msg, size_t cap)
{
    static const struct {
        const char *field, *why;
    } asks[] = {
        {"tools", "tool calls are for /v1/chat/completions"},
        {"functions", "function calls are not supported"},
        {"echo", "the prompt is not echoed"},
    };
    json_object *v;
    /* a chat's tools are toolcall.c's to read */
    for (size_t i = chat ? 1 : 0; i < sizeof asks / sizeof asks[0]; i++)
        if (json_object_object_get_ex(body, asks[i].field, &v) && !jsonfield_asks_nothing(v)) {
            snprintf(msg, cap, "'%s': %s", asks[i].field, asks[i].why);
            return -1;
        }
    /* a count, whose off value is 1 */
    if (json_object_object_get_ex(body, "best_of", &v) && !json_object_is_type(v, json_type_null) &&
        !(json_object_is_type(v, json_type_int) && json_object_get_int64(v) == 1)) {
        snprintf(msg, cap, "'best_of': one candidate is generated per choice");
        return -1;
    }
    return 0;
}

/* Today as the family's tool prompt writes it: llama3's "26 Jul 2024", in English
 * whatever the locale; gpt-oss's "2024-07-26". */
static void today(enum chat_family f, char out[16])
{
    static const char *const months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                         "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    time_t t = time(NULL);
    struct tm tm;
    if (!localtime_r(&t, &tm))
        memset(&tm, 0, sizeof tm);
    if (f == CHAT_GPT_OSS)
        snprintf(out, 16, "%04d-%02d-%02d", (tm.tm_year + 1900) % 10000, (tm.tm_mon + 1) % 100,
                 tm.tm_mday % 100);
    else
        snprintf(out, 16, "%02d %s %04d", tm.tm_mday % 100, months[tm.tm_mon % 12],
                 (tm.tm_year + 1900) % 10000);
}

/* Whether hr's replies are read for calls (a scan is made for them). */
static bool reads_calls(const hreq *hr)
{
    return hr->tools.parse && hr->tools.n > 0;
}

/* The messages with hr's tools (for gpt-oss, with none too: its prompt has the effort and
 * the replies' reasoning); hr->scan made when replies are read for calls. */
static char *render_with_tools(hreq *hr, json_object *msgs, char *msg, size_t cap)
{
    char date[16];
    today(hr->tools.family, date);
    char *out = toolcall_render(&hr->tools, msgs, date, !hr->no_thinking, hr->effort, msg, cap);
    if (out && reads_calls(hr) && !(hr->scan = toolcall_scan_new(&hr->tools))) {
        free(out);
        snprintf(msg, cap, "out of memory");
        return NULL;
    }
    return out;
}

char *openai_render_chat(hreq *hr, json_object *msgs, char *msg, size_t cap)
{
    if (hr->tools.n > 0 || hr->family == CHAT_GPT_OSS)
        return render_with_tools(hr, msgs, msg, cap);
    enum chat_family family = hr->family;
    size_t n = json_object_array_length(msgs);
    struct chat_message *cm = calloc(n ? n : 1, sizeof *cm);
    char **owned = calloc(n ? n : 1, sizeof *owned);
    char *out = NULL;
    if (!cm || !owned) {
        snprintf(msg, cap, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        json_object *m = json_object_array_get_idx(msgs, i), *role;
        if (!json_object_is_type(m, json_type_object) ||
            !json_object_object_get_ex(m, "role", &role) ||
            !json_object_is_type(role, json_type_string)) {
            snprintf(msg, cap, "messages[%zu] needs a 'role' string", i);
            goto done;
        }
        const char *r = json_object_get_string(role);
        /* OpenAI's newer name for the system role. */
        if (strcmp(r, "developer") == 0)
            r = "system";
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant")) {
            snprintf(msg, cap, "messages[%zu]: role '%.32s' is not supported (system, user, "
                               "assistant)", i, r);
            goto done;
        }
        cm[i].role = r;
        if (!(cm[i].content = jsonfield_message_content(m, &owned[i], msg, cap)))
            goto done;
    }
    bool thinking = !hr->no_thinking;
    int len = chat_apply_think(family, cm, (int)n, true, thinking, NULL, 0);
    if (len < 0 || !(out = malloc((size_t)len + 1))) {
        snprintf(msg, cap, len < 0 ? "the messages cannot be rendered" : "out of memory");
        goto done;
    }
    chat_apply_think(family, cm, (int)n, true, thinking, out, (size_t)len + 1);
done:
    for (size_t i = 0; owned && i < n; i++)
        free(owned[i]);
    free(owned);
    free(cm);
    return out;
}

int openai_chat_messages(json_object *body, json_object **msgs, char *msg, size_t cap)
{
    if (jsonfield_get(body, "messages", "", json_type_array, msgs, msg, cap) != 1 ||
        json_object_array_length(*msgs) == 0) {
        snprintf(msg, cap, "'messages' must be a non-empty array");
        return -1;
    }
    return 0;
}

int openai_read_thinking(hreq *hr, char *msg, size_t cap)
{
    json_object *kw, *v;
    int rc = jsonfield_get(hr->body, "chat_template_kwargs", "", json_type_object, &kw, msg, cap);
    json_object *effort = NULL;
    if (rc == 1 && jsonfield_get(kw, "reasoning_effort", "chat_template_kwargs.",
                                 json_type_string, &effort, msg, cap) < 0)
        return -1;
    if (rc == 1)
        rc = jsonfield_get(kw, "enable_thinking", "chat_template_kwargs.", json_type_boolean, &v,
                           msg, cap);
    if (rc < 0)
        return -1;
    hr->no_thinking = rc == 1 && !json_object_get_boolean(v);
    /* OpenAI's field, or llama.cpp's template argument */
    if ((rc = jsonfield_get(hr->body, "reasoning_effort", "", json_type_string, &v, msg, cap)) < 0)
        return -1;
    if (rc == 1)
        effort = v;
    if (effort && hr->family == CHAT_GPT_OSS) {
        hr->effort = json_object_get_string(effort);
        if (!chat_harmony_effort_valid(hr->effort)) {
            snprintf(msg, cap, "'reasoning_effort' must be \"low\", \"medium\" or \"high\" for "
                               "gpt-oss");
            return -1;
        }
    }
    if ((rc = jsonfield_get(hr->body, "reasoning_format", "", json_type_string, &v, msg, cap)) < 0)
        return -1;
    const char *format = rc ? json_object_get_string(v) : hr->h->cfg->reasoning_format;
    /* deepseek-legacy (the text kept whole and the reasoning apart too) is not given */
    if (strcmp(format, "auto") && strcmp(format, "deepseek") && strcmp(format, "none")) {
        snprintf(msg, cap, "'reasoning_format' must be \"auto\", \"deepseek\" or \"none\"");
        return -1;
    }
    hr->reasoning = strcmp(format, "none") && chat_thinking(hr->family) != CHAT_THINK_NONE;
    return 0;
}

void openai_split_start(hreq *hr)
{
    hr->reasoning &= !hr->tools.forced;
    for (unsigned i = 0; hr->reasoning && i < hr->n_choices; i++)
        reasoning_start(&hr->choices[i].split, chat_thinking_for(hr->family, !hr->no_thinking),
                        reads_calls(hr));
}

int openai_split_whole(hreq *hr, const char *text, reasoning_span *reasoning,
                       reasoning_span *content)
{
    if (hr->reasoning && chat_thinking(hr->family) == CHAT_THINK_HARMONY) {
        free(hr->whole_split);
        hr->whole_split = NULL;
        return reasoning_split_harmony(text, strlen(text), reads_calls(hr),
                                       &hr->whole_split, reasoning, content);
    }
    if (hr->reasoning) {
        reasoning_split_text(chat_thinking_for(hr->family, !hr->no_thinking), text, strlen(text),
                             reasoning, content);
        return 0;
    }
    *reasoning = (reasoning_span){true, text, 0};
    *content = (reasoning_span){false, text, strlen(text)};
    return 0;
}

/* Submits r once per choice of hr: choice i as request r->id + i, and with a seed, seed
 * + i, so that the whole reply is reproducible and its choices differ. Stops at a choice
 * refused at once (hr is then answered, and those before it cancelled). */
static void submit_choices(hreq *hr, Llms__Request *r, Llms__GenerationParams *gp)
{
    uint64_t first = r->id, seed = gp->seed;
    for (unsigned i = 0; i < hr->n_choices && !hr->done; i++) {
        r->id = first + i;
        gp->seed = seed + i;
        if (http_submit(hr, r))
            return;
    }
}

/* Reads a generation request's fields beside its prompt: streaming, llmsd.context, the
 * sampling parameters (into gp and lists; gp->stop has room for STOP_MAX), logit bias,
 * logprobs, n, and for a chat the reasoning switch and the tools; then refuses the
 * combinations llmsd does not support. 0, or -1 with msg. */
static int read_generation_options(hreq *hr, bool chat, Llms__GenerationParams *gp,
                                   llamaparams_lists *lists, char *msg, size_t cap)
{
    json_object *v, *x;
    int rc;
    if ((rc = jsonfield_get(hr->body, "stream", "", json_type_boolean, &v, msg, cap)) < 0)
        return -1;
    hr->stream = rc && json_object_get_boolean(v);
    if (jsonfield_get(hr->body, "stream_options", "", json_type_object, &x, msg, cap) == 1 &&
        jsonfield_get(x, "include_usage", "", json_type_boolean, &v, msg, cap) == 1)
        hr->include_usage = json_object_get_boolean(v);
    if ((rc = jsonfield_get(hr->body, "llmsd", "", json_type_object, &x, msg, cap)) < 0)
        return -1;
    if (rc && (rc = jsonfield_get(x, "context", "", json_type_string, &v, msg, cap)) < 0)
        return -1;
    if (rc)
        hr->context_id = json_object_get_string(v);
    if (hr->context_id && !chat) {
        snprintf(msg, cap, "'llmsd.context' is for /v1/chat/completions");
        return -1;
    }
    /* A rendered chat carries its template's end of turn as one more stop string. */
    size_t max_stops = STOP_MAX - 1 - (chat && !hr->context_id);
    if (read_params(hr->body, gp, max_stops, lists, msg, cap) ||
        read_logit_bias(hr, gp, msg, cap) || read_logprobs(hr, gp, msg, cap) ||
        refuse_unhonoured(hr->body, chat, msg, cap) || read_n(hr, msg, cap) ||
        (chat && (openai_read_thinking(hr, msg, cap) < 0 ||
                  toolcall_read(hr->body, hr->family, &hr->tools, msg, cap) < 0 ||
                  toolcall_constrain(&hr->tools, gp, msg, cap) < 0)))
        return -1;
    openai_split_start(hr);
    /* the calls of one reply are read as it streams: one choice at a time */
    if (hr->tools.n > 0 && hr->n_choices > 1) {
        snprintf(msg, cap, "'tools' with 'n' above 1 is not supported");
        return -1;
    }
    /* a context holds its conversation as text turns, with no place for tools; its turns
     * are rendered by the worker against its history, with the template's defaults */
    if (hr->context_id && hr->tools.n > 0) {
        snprintf(msg, cap, "'tools' cannot be used with 'llmsd.context'");
        return -1;
    }
    if (hr->context_id && hr->no_thinking) {
        snprintf(msg, cap, "'chat_template_kwargs.enable_thinking' false cannot be used with "
                           "'llmsd.context'");
        return -1;
    }
    return 0;
}

/* The turn of a chat sent to a context, which holds the conversation: the last message,
 * the user's. -1 with msg; 0 with *turn, NULL when out of memory. */
static int context_turn(json_object *msgs, char **turn, char *msg, size_t cap)
{
    json_object *last = json_object_array_get_idx(msgs, json_object_array_length(msgs) - 1);
    json_object *role;
    if (!json_object_is_type(last, json_type_object) ||
        !json_object_object_get_ex(last, "role", &role) ||
        !json_object_is_type(role, json_type_string) ||
        strcmp(json_object_get_string(role), "user") != 0) {
        snprintf(msg, cap, "with 'llmsd.context' the last message must be the user's");
        return -1;
    }
    char *owned;
    const char *text = jsonfield_message_content(last, &owned, msg, cap);
    if (!text)
        return -1;
    *turn = owned ? owned : strdup(text);
    return 0;
}

/* A completion's prompt, and with a suffix (the legacy insert: the text between the
 * prompt and the suffix) its fill-in-the-middle part in fim. -1 with msg; 0 with
 * *prompt, NULL when out of memory. */
static int completion_prompt(hreq *hr, char **prompt, Llms__PromptPart *fim, char *msg,
                             size_t cap)
{
    json_object *p, *suffix;
    if (!json_object_object_get_ex(hr->body, "prompt", &p)) {
        snprintf(msg, cap, "'prompt' is required");
        return -1;
    }
    if (json_object_is_type(p, json_type_array) && json_object_array_length(p) == 1)
        p = json_object_array_get_idx(p, 0);
    if (!json_object_is_type(p, json_type_string)) {
        snprintf(msg, cap, "'prompt' must be a string (or an array of one string)");
        return -1;
    }
    int has_suffix = jsonfield_get(hr->body, "suffix", "", json_type_string, &suffix, msg, cap);
    if (has_suffix < 0 ||
        (has_suffix && json_object_get_string_len(suffix) &&
         fimreq_prompt_part(hr, json_object_get_string(p), json_object_get_string(suffix), fim,
                            msg, cap)))
        return -1;
    *prompt = strdup(json_object_get_string(p));
    return 0;
}

/* Builds and submits the native request of a generation route. */
void openai_start_generate(hreq *hr, Llms__Request *r, char *msg, size_t cap)
{
    const char *stops[STOP_MAX];
    Llms__GenerationParams gp = LLMS__GENERATION_PARAMS__INIT;
    llamaparams_lists lists;
    gp.stop = (char **)stops;
    /* a Responses request comes as the chat it asks for (responses_chat_body) */
    bool chat = hr->route == R_CHAT || hr->route == R_RESPONSES;
    if (read_generation_options(hr, chat, &gp, &lists, msg, cap))
        goto bad;
    char *prompt = NULL;
    Llms__PromptPart fim = LLMS__PROMPT_PART__INIT, *fim_ptr = &fim;
    Llms__CompleteRequest cr = LLMS__COMPLETE_REQUEST__INIT;
    Llms__CallRequest call = LLMS__CALL_REQUEST__INIT;
    if (chat) {
        json_object *msgs;
        if (openai_chat_messages(hr->body, &msgs, msg, cap))
            goto bad;
        if (hr->context_id) {
            if (context_turn(msgs, &prompt, msg, cap))
                goto bad;
            call.context_id = (char *)hr->context_id;
            call.model = (char *)hr->model_named;
            call.prompt = prompt;
            call.params = &gp;
            r->body_case = LLMS__REQUEST__BODY_CALL;
            r->call = &call;
        } else {
            if (!(prompt = openai_render_chat(hr, msgs, msg, cap)))
                goto bad;
            stops[gp.n_stop++] = chat_stop_text(hr->family);
        }
    } else if (completion_prompt(hr, &prompt, &fim, msg, cap)) {
        goto bad;
    }
    if (!prompt || (hr->stream && !(hr->sse = evbuffer_new()))) {
        free(prompt);
        free(fim.tokens);
        openai_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    if (r->body_case != LLMS__REQUEST__BODY_CALL) {
        cr.prompt = fim.tokens ? "" : prompt;
        cr.prompt_parts = fim.tokens ? &fim_ptr : NULL;
        cr.n_prompt_parts = fim.tokens ? 1 : 0;
        cr.params = &gp;
        cr.model = (char *)hr->model_named;
        r->body_case = LLMS__REQUEST__BODY_COMPLETE;
        r->complete = &cr;
    }
    submit_choices(hr, r, &gp);
    free(prompt);
    free(fim.tokens);
    return;
bad:
    openai_finish_error(hr, LLMS__ERROR_CODE__INVALID_ARGUMENT, msg);
}

/* POST /v1/llmsd/rag: {"kb", "question", "top_k"?, "retrieval"? (rrf, sum, bm25, vector),
 * "system"?, "no_qa"?, "no_qkv"?, "share_system_uid"?, "stream"?, and the sampling fields of
 * a completion}. */
void openai_start_rag(hreq *hr, Llms__Request *r, char *msg, size_t cap)
{
    static const char *const retrievals[] = {"rrf", "sum", "bm25", "vector"};
    json_object *v;
    const char *stops[STOP_MAX];
    Llms__GenerationParams gp = LLMS__GENERATION_PARAMS__INIT;
    llamaparams_lists lists;
    gp.stop = (char **)stops;
    Llms__RagQueryRequest rq = LLMS__RAG_QUERY_REQUEST__INIT;
    int rc;
    if ((rc = jsonfield_get(hr->body, "stream", "", json_type_boolean, &v, msg, cap)) < 0)
        goto bad;
    hr->stream = rc && json_object_get_boolean(v);
    if (jsonfield_get(hr->body, "kb", "", json_type_string, &v, msg, cap) != 1) {
        snprintf(msg, cap, "'kb' (a knowledge base name) is required");
        goto bad;
    }
    rq.kb = (char *)json_object_get_string(v);
    if (jsonfield_get(hr->body, "question", "", json_type_string, &v, msg, cap) != 1) {
        snprintf(msg, cap, "'question' (a string) is required");
        goto bad;
    }
    rq.question = (char *)json_object_get_string(v);
    if ((rc = positive_u32_field(hr->body, "top_k", &rq.top_k, msg, cap)) < 0)
        goto bad;
    rq.has_top_k = rc == 1;
    if ((rc = jsonfield_get(hr->body, "retrieval", "", json_type_string, &v, msg, cap)) < 0)
        goto bad;
    if (rc) {
        const char *name = json_object_get_string(v);
        size_t i = 0;
        while (i < sizeof retrievals / sizeof retrievals[0] && strcmp(name, retrievals[i]))
            i++;
        if (i == sizeof retrievals / sizeof retrievals[0]) {
            snprintf(msg, cap, "'retrieval' must be rrf, sum, bm25 or vector");
            goto bad;
        }
        rq.has_retrieval = 1;
        rq.retrieval = (Llms__Retrieval)i;
    }
    if ((rc = jsonfield_get(hr->body, "system", "", json_type_string, &v, msg, cap)) < 0)
        goto bad;
    if (rc)
        rq.system_prompt = (char *)json_object_get_string(v);
    if ((rc = jsonfield_get(hr->body, "no_qa", "", json_type_boolean, &v, msg, cap)) < 0)
        goto bad;
    if (rc)
        rq.has_no_qa = 1, rq.no_qa = json_object_get_boolean(v);
    if ((rc = jsonfield_get(hr->body, "no_qkv", "", json_type_boolean, &v, msg, cap)) < 0)
        goto bad;
    if (rc)
        rq.has_no_qkv = 1, rq.no_qkv = json_object_get_boolean(v);
    if ((rc = jsonfield_get(hr->body, "share_system_uid", "", json_type_boolean, &v, msg, cap)) < 0)
        goto bad;
    if (rc)
        rq.has_share_system_uid = 1, rq.share_system_uid = json_object_get_boolean(v);
    if (read_params(hr->body, &gp, STOP_MAX, &lists, msg, cap) ||
        read_logit_bias(hr, &gp, msg, cap) || read_logprobs(hr, &gp, msg, cap) ||
        read_n(hr, msg, cap))
        goto bad;
    rq.params = &gp;
    if (hr->stream && !(hr->sse = evbuffer_new())) {
        openai_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    r->body_case = LLMS__REQUEST__BODY_RAG_QUERY;
    r->rag_query = &rq;
    http_submit(hr, r);
    return;
bad:
    openai_finish_error(hr, LLMS__ERROR_CODE__INVALID_ARGUMENT, msg);
}

void openai_start_embed(hreq *hr, Llms__Request *r, char *msg, size_t cap)
{
    json_object *in, *v;
    int rc;
    if ((rc = jsonfield_get(hr->body, "encoding_format", "", json_type_string, &v, msg, cap)) < 0)
        goto bad;
    if (rc) {
        const char *f = json_object_get_string(v);
        if (strcmp(f, "float") && strcmp(f, "base64")) {
            snprintf(msg, cap, "'encoding_format' must be float or base64");
            goto bad;
        }
        hr->base64 = strcmp(f, "base64") == 0;
    }
    if (positive_u32_field(hr->body, "dimensions", &hr->dimensions, msg, cap) < 0)
        goto bad;
    if (!json_object_object_get_ex(hr->body, "input", &in)) {
        snprintf(msg, cap, "'input' is required");
        goto bad;
    }
    openai_submit_embed(hr, r, in, "input", msg, cap);
    return;
bad:
    openai_finish_error(hr, LLMS__ERROR_CODE__INVALID_ARGUMENT, msg);
}

void openai_submit_embed(hreq *hr, Llms__Request *r, json_object *in, const char *field,
                         char *msg, size_t cap)
{
    const char **texts;
    size_t n;
    int rc = jsonfield_strings(in, &texts, &n);
    if (rc == -2) {
        http_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    if (rc < 0 || n == 0) {
        free(texts);
        snprintf(msg, cap, "'%s' must be a string or a non-empty array of strings (token "
                           "arrays are not supported)", field);
        http_finish_error(hr, LLMS__ERROR_CODE__INVALID_ARGUMENT, msg);
        return;
    }
    Llms__EmbedRequest e = LLMS__EMBED_REQUEST__INIT;
    e.texts = (char **)texts;
    e.n_texts = n;
    e.model = (char *)hr->model_named;
    r->body_case = LLMS__REQUEST__BODY_EMBED;
    r->embed = &e;
    http_submit(hr, r);
    free(texts);
}

/* Jina's form ("documents", "return_documents"), or TEI's, which llama.cpp's rerank
 * route takes too ("texts", "return_text"; raw_scores, the scores before the sigmoid,
 * refused as they are never given). */
void openai_start_rerank(hreq *hr, Llms__Request *r, char *msg, size_t cap)
{
    json_object *q, *docs, *v;
    int rc;
    hr->tei = json_object_object_get_ex(hr->body, "texts", &v) &&
              !json_object_is_type(v, json_type_null);
    const char *field = hr->tei ? "texts" : "documents";
    if (jsonfield_get(hr->body, "query", "", json_type_string, &q, msg, cap) != 1) {
        snprintf(msg, cap, "'query' must be a string");
        goto bad;
    }
    if (hr->tei && json_object_object_get_ex(hr->body, "documents", &v) &&
        !json_object_is_type(v, json_type_null)) {
        snprintf(msg, cap, "'texts' (TEI's form) and 'documents' (Jina's) both given: give one");
        goto bad;
    }
    if (jsonfield_get(hr->body, field, "", json_type_array, &docs, msg, cap) != 1 ||
        json_object_array_length(docs) == 0) {
        snprintf(msg, cap, "'%s' must be a non-empty array", field);
        goto bad;
    }
    size_t n = json_object_array_length(docs);
    int64_t top = (int64_t)n;
    if ((rc = jsonfield_get(hr->body, "top_n", "", json_type_int, &v, msg, cap)) < 0)
        goto bad;
    if (rc)
        top = json_object_get_int64(v);
    if (top < 1) {
        snprintf(msg, cap, "'top_n' must be at least 1");
        goto bad;
    }
    if ((rc = jsonfield_get(hr->body, hr->tei ? "return_text" : "return_documents", "",
                            json_type_boolean, &v, msg, cap)) < 0)
        goto bad;
    hr->return_documents = rc && json_object_get_boolean(v);
    if (hr->tei) {
        if ((rc = jsonfield_get(hr->body, "raw_scores", "", json_type_boolean, &v, msg, cap)) < 0)
            goto bad;
        if (rc && json_object_get_boolean(v)) {
            snprintf(msg, cap, "'raw_scores': the scores are relevance in [0, 1], never the "
                               "raw scores before it");
            goto bad;
        }
    }
    const char **texts = malloc(n * sizeof *texts);
    if (!texts) {
        openai_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        json_object *d = json_object_array_get_idx(docs, i), *t;
        if (!hr->tei && json_object_is_type(d, json_type_object) &&
            json_object_object_get_ex(d, "text", &t))
            d = t;
        if (!json_object_is_type(d, json_type_string)) {
            free(texts);
            snprintf(msg, cap, hr->tei ? "texts[%zu] must be a string"
                                       : "documents[%zu] must be a string or {\"text\": string}",
                     i);
            goto bad;
        }
        texts[i] = json_object_get_string(d);
    }
    Llms__RerankRequest rr = LLMS__RERANK_REQUEST__INIT;
    rr.query = (char *)json_object_get_string(q);
    rr.model = (char *)hr->model_named;
    rr.documents = (char **)texts;
    rr.n_documents = n;
    rr.has_top_k = 1;
    rr.top_k = (uint32_t)(top < (int64_t)n ? top : (int64_t)n);
    /* Relevance scores are the answer, so every winner's score must be finished. */
    rr.has_mode = 1;
    rr.mode = LLMS__RERANK_MODE__RERANK_ORDERED;
    r->body_case = LLMS__REQUEST__BODY_RERANK;
    r->rerank = &rr;
    http_submit(hr, r);
    free(texts);
    return;
bad:
    openai_finish_error(hr, LLMS__ERROR_CODE__INVALID_ARGUMENT, msg);
}

/* ---- models ---- */

static json_object *role_array(unsigned roles)
{
    json_object *a = json_object_new_array();
    for (unsigned bit = MODELS_GENERATE; a && bit <= MODELS_DRAFT; bit <<= 1)
        if (roles & bit)
            json_object_array_add(a, json_object_new_string(models_role_name(bit)));
    return a;
}

/* An adapter model's adapters as [{"path", "scale"}, ...] (its lora_spec read again). */
static json_object *adapters_array(const models_view_entry *e)
{
    json_object *a = json_object_new_array();
    char path[CONFIG_PATH_MAX], err[ERR_MAX];
    float scale;
    for (const char *p = e->lora_spec; a && config_lora_next(&p, path, &scale, err) == 1;) {
        json_object *o = json_object_new_object();
        if (!o)
            break;
        json_object_object_add(o, "path", json_object_new_string(path));
        json_object_object_add(o, "scale", json_object_new_double(scale));
        json_object_array_add(a, o);
    }
    return a;
}

/* A model in OpenAI's shape, with its roles and the roles it is the default for in
 * "llmsd"; an adapter model's base as vLLM lists a LoRA module's ("parent"), and its
 * adapters in "llmsd"; NULL when out of memory. */
static json_object *model_obj(const models_view_entry *e)
{
    json_object *m = json_object_new_object(), *x = json_object_new_object();
    if (!m || !x) {
        json_object_put(m);
        json_object_put(x);
        return NULL;
    }
    json_object_object_add(m, "id", json_object_new_string(e->name));
    json_object_object_add(m, "object", json_object_new_string("model"));
    json_object_object_add(m, "created", json_object_new_int64(0));
    json_object_object_add(m, "owned_by", json_object_new_string("llmsd"));
    json_object_object_add(x, "roles", role_array(e->roles));
    json_object_object_add(x, "default_for", role_array(e->defaults));
    if (e->base[0]) {
        json_object_object_add(m, "parent", json_object_new_string(e->base));
        json_object_object_add(x, "adapters", adapters_array(e));
    }
    json_object_object_add(m, "llmsd", x);
    return m;
}

/* GET /v1/models: every model of the registry, the default generate model first (clients
 * that take the first as theirs get what a request naming none gets). GET
 * /v1/models/{id} (id: id_len bytes): that one model, 404 model_not_found when the
 * registry has none of that name. */
void openai_send_models(http *h, httpwire_conn *wc, const char *id, size_t id_len)
{
    if (id) {
        for (size_t i = 0; i < h->view.n; i++) {
            const models_view_entry *e = &h->view.entries[i];
            if (strlen(e->name) == id_len && memcmp(e->name, id, id_len) == 0) {
                http_send_json(h, wc, R_MODELS, 200, model_obj(e));
                return;
            }
        }
        openai_send_error(h, wc, R_MODELS, 404, "invalid_request_error", "model_not_found",
                          "the model '%.*s' does not exist", (int)(id_len > 200 ? 200 : id_len),
                          id);
        return;
    }
    json_object *o = json_object_new_object(), *data = json_object_new_array();
    const models_view_entry *first = http_view_default(h, MODELS_GENERATE);
    for (size_t i = 0; i <= h->view.n && o && data; i++) {
        const models_view_entry *e = i == 0 ? first : &h->view.entries[i - 1];
        if (!e || (i > 0 && e == first))
            continue;
        json_object *m = model_obj(e);
        if (!m) {
            json_object_put(o);
            o = NULL;
            break;
        }
        json_object_array_add(data, m);
    }
    if (o)
        json_object_object_add(o, "object", json_object_new_string("list"));
    if (o && data)
        json_object_object_add(o, "data", data);
    else
        json_object_put(data);
    http_send_json(h, wc, R_MODELS, 200, o);
}
