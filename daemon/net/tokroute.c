/*
 * tokroute.c — the gateway's POST /tokenize and /detokenize, in llama.cpp's server's
 * shape (which vLLM's /tokenize shares but for its field names, taken too): an app
 * counts a prompt's tokens, or finds the ids that logit_bias names, with the model's own
 * tokenizer.
 *
 *   /tokenize   {"content" | "prompt": text, "add_special" | "add_special_tokens": bool,
 *                "parse_special": bool, "with_pieces": bool, "model": name}
 *                                                       -> {"tokens": [...], "count": n}
 *   /detokenize {"tokens": [...], "model": name}          -> {"content": text}
 *
 * add_special defaults to false, as llama.cpp's; vLLM's default of true is not kept, as
 * one default has to win. parse_special defaults to true, as llama.cpp's server reads
 * special tokens ("<|im_end|>") in the text unless told not to: a prompt is counted as
 * /completion evaluates it. with_pieces makes each token {"id", "piece"}, as llama.cpp's
 * server gives it: the token's text (a control token's as written, "<s>"), or the array
 * of its byte values when they are no whole UTF-8 (a byte token of a character cut in
 * several), which a JSON string cannot carry.
 */
#include <stdlib.h>
#include <string.h>

#include "daemon/net/http_internal.h"
#include "engine/tok/utf8.h"

/* The boolean field a or else b of body: 1 true, 0 false, dflt when absent (or null), -1
 * not a boolean (msg filled). */
static int read_flag(json_object *body, const char *a, const char *b, int dflt, char *msg,
                     size_t cap)
{
    json_object *v;
    const char *name = a;
    if (!json_object_object_get_ex(body, a, &v) || json_object_is_type(v, json_type_null)) {
        name = b;
        if (!b || !json_object_object_get_ex(body, b, &v) || json_object_is_type(v, json_type_null))
            return dflt;
    }
    if (!json_object_is_type(v, json_type_boolean)) {
        snprintf(msg, cap, "'%s' must be true or false", name);
        return -1;
    }
    return json_object_get_boolean(v) ? 1 : 0;
}

static void start_tokenize(hreq *hr, Llms__Request *r, char *msg, size_t cap)
{
    json_object *text;
    if (!(json_object_object_get_ex(hr->body, "content", &text) ||
          json_object_object_get_ex(hr->body, "prompt", &text)) ||
        !json_object_is_type(text, json_type_string)) {
        snprintf(msg, cap, "'content' (or 'prompt') must be a string");
        goto bad;
    }
    int add_special = read_flag(hr->body, "add_special", "add_special_tokens", 0, msg, cap);
    int parse_special =
        add_special < 0 ? -1 : read_flag(hr->body, "parse_special", NULL, 1, msg, cap);
    int with_pieces =
        parse_special < 0 ? -1 : read_flag(hr->body, "with_pieces", NULL, 0, msg, cap);
    if (add_special < 0 || parse_special < 0 || with_pieces < 0)
        goto bad;
    Llms__TokenizeRequest t = LLMS__TOKENIZE_REQUEST__INIT;
    t.text = (char *)json_object_get_string(text);
    t.has_add_special = 1;
    t.add_special = add_special;
    t.has_parse_special = 1;
    t.parse_special = parse_special;
    t.has_with_pieces = 1;
    t.with_pieces = with_pieces;
    t.model = (char *)hr->model_named;
    r->body_case = LLMS__REQUEST__BODY_TOKENIZE;
    r->tokenize = &t;
    http_submit(hr, r);
    return;
bad:
    openai_finish_error(hr, LLMS__ERROR_CODE__INVALID_ARGUMENT, msg);
}

static void start_detokenize(hreq *hr, Llms__Request *r, char *msg, size_t cap)
{
    json_object *arr;
    if (!json_object_object_get_ex(hr->body, "tokens", &arr) ||
        !json_object_is_type(arr, json_type_array)) {
        openai_finish_error(hr, LLMS__ERROR_CODE__INVALID_ARGUMENT, "'tokens' must be an array");
        return;
    }
    size_t n = json_object_array_length(arr);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) {
        openai_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        json_object *v = json_object_array_get_idx(arr, i);
        int64_t id = json_object_get_int64(v);
        if (!json_object_is_type(v, json_type_int) || id < 0 || id > INT32_MAX) {
            snprintf(msg, cap, "tokens[%zu] must be a token id (an integer >= 0)", i);
            free(ids);
            openai_finish_error(hr, LLMS__ERROR_CODE__INVALID_ARGUMENT, msg);
            return;
        }
        ids[i] = (int32_t)id;
    }
    Llms__DetokenizeRequest d = LLMS__DETOKENIZE_REQUEST__INIT;
    d.tokens = ids;
    d.n_tokens = n;
    d.model = (char *)hr->model_named;
    r->body_case = LLMS__REQUEST__BODY_DETOKENIZE;
    r->detokenize = &d;
    http_submit(hr, r);
    free(ids);
}

void tokroute_start(hreq *hr, Llms__Request *r, char *msg, size_t cap)
{
    if (hr->route == R_TOKENIZE)
        start_tokenize(hr, r, msg, cap);
    else
        start_detokenize(hr, r, msg, cap);
}

/* A token of with_pieces: {"id", "piece"}, the piece a string when its bytes are whole
 * UTF-8, else the array of their values. NULL out of memory. */
static json_object *token_with_piece(int32_t id, const ProtobufCBinaryData *piece)
{
    json_object *e = json_object_new_object(), *p;
    if (!e)
        return NULL;
    if (utf8_valid((const char *)piece->data, piece->len))
        p = json_object_new_string_len((const char *)piece->data, (int)piece->len);
    else
        p = openai_piece_bytes(piece);
    if (!p) {
        json_object_put(e);
        return NULL;
    }
    json_object_object_add(e, "id", json_object_new_int(id));
    json_object_object_add(e, "piece", p);
    return e;
}

void tokroute_on_tokenize(hreq *hr, const Llms__TokenizeResponse *t)
{
    http *h = hr->h;
    http_req_finish(hr);
    /* the body was read at the start: with_pieces is a boolean, null or absent */
    json_object *v;
    bool pieces = json_object_object_get_ex(hr->body, "with_pieces", &v) &&
                  json_object_get_boolean(v);
    if (pieces && t->n_pieces != t->n_tokens) {
        openai_send_error(h, hr->wc, hr->route, 500, "server_error", "internal_error",
                          "the tokenizer gave %zu pieces for %zu tokens", t->n_pieces,
                          t->n_tokens);
        return;
    }
    json_object *o = json_object_new_object(), *tokens = json_object_new_array_ext((int)t->n_tokens);
    bool ok = o && tokens;
    for (size_t i = 0; ok && i < t->n_tokens; i++) {
        json_object *e = pieces ? token_with_piece(t->tokens[i], &t->pieces[i])
                                : json_object_new_int(t->tokens[i]);
        ok = e && json_object_array_add(tokens, e) == 0;
        if (!ok)
            json_object_put(e);
    }
    if (!ok) {
        json_object_put(o);
        json_object_put(tokens);
        openai_send_error(h, hr->wc, hr->route, 500, "server_error", "internal_error",
                          "out of memory");
        return;
    }
    json_object_object_add(o, "tokens", tokens);
    json_object_object_add(o, "count", json_object_new_int64((int64_t)t->n_tokens));
    http_send_json(h, hr->wc, hr->route, 200, o);
}

void tokroute_on_detokenize(hreq *hr, const Llms__DetokenizeResponse *d)
{
    http *h = hr->h;
    http_req_finish(hr);
    /* A byte token alone is no whole character: JSON text must be UTF-8, so such bytes
     * come out as U+FFFD, as they do in a completion. */
    size_t n = strlen(d->text);
    char *text = malloc(UTF8_OUT_CAP(n) + 1);
    json_object *o = json_object_new_object();
    if (!text || !o) {
        free(text);
        json_object_put(o);
        openai_send_error(h, hr->wc, hr->route, 500, "server_error", "internal_error",
                          "out of memory");
        return;
    }
    utf8_stream u = {0};
    size_t len = utf8_stream_feed(&u, d->text, n, text);
    len += utf8_stream_flush(&u, text + len);
    json_object_object_add(o, "content", json_object_new_string_len(text, (int)len));
    free(text);
    http_send_json(h, hr->wc, hr->route, 200, o);
}
