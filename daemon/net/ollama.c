/*
 * ollama.c — ollama's REST API on the gateway (http.h), for the tools that speak it
 * rather than OpenAI's: /api/generate and /api/chat become native Completes (streamed
 * as NDJSON lines, ollama's default, or answered whole), /api/embed and /api/embeddings
 * native Embeds; /api/version, /api/tags, /api/ps and /api/show are answered from the
 * registry's view; model management (/api/pull and the rest) is refused, as the models
 * are the settings' and llmsctl's; a suffix fills in the middle (daemon/net/fimreq.h).
 * Errors are ollama's {"error": "..."}.
 *
 * What ollama does that llmsd does not is refused naming the field (images, a
 * template of the request's own, context tokens, tail-free sampling, which llama.cpp has
 * removed), as the OpenAI routes refuse theirs: a
 * reply that ignored them would pass for one that honoured them. What only concerns how
 * ollama runs its models (keep_alive, num_gpu, num_thread, ...) is read and ignored:
 * llmsd keeps its models loaded and runs them its own way. A chat's tools are
 * toolcall.c's, as on the OpenAI route. A thinking model's reasoning comes apart as
 * "thinking" (reasoning.h) unless think is false, as current ollama gives it.
 */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "daemon/net/fimreq.h"
#include "daemon/net/http_internal.h"
#include "daemon/net/jsonfield.h"
#include "engine/tok/chat.h"
#include "engine/tok/chatharmony.h"
#include "engine/tok/stop.h"

#define SUFFIX_LATEST ":latest"

/* ---- times ---- */

/* An RFC 3339 time in UTC, as ollama writes them: with nanoseconds unless nsec < 0. */
static void rfc3339(int64_t sec, long nsec, char out[48])
{
    time_t t = (time_t)sec;
    struct tm tm;
    if (!gmtime_r(&t, &tm))
        memset(&tm, 0, sizeof tm);
    size_t n = strftime(out, 48, "%Y-%m-%dT%H:%M:%S", &tm);
    if (nsec >= 0)
        snprintf(out + n, 48 - n, ".%09ldZ", nsec);
    else
        snprintf(out + n, 48 - n, "Z");
}

static void now_rfc3339(char out[48])
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    rfc3339((int64_t)ts.tv_sec, ts.tv_nsec, out);
}

/* Milliseconds as ollama's durations: integer nanoseconds. */
static json_object *nanoseconds(double ms)
{
    return json_object_new_int64(ms > 0 ? (int64_t)(ms * 1e6) : 0);
}

/* ---- errors ---- */

void ollama_send_error(http *h, httpwire_conn *wc, enum route r, int status, const char *msg)
{
    json_object *o = json_object_new_object();
    if (o)
        json_object_object_add(o, "error", json_object_new_string(msg));
    http_send_json(h, wc, r, status, o);
}

void ollama_finish_error(hreq *hr, Llms__ErrorCode code, const char *msg)
{
    int status;
    const char *type, *ecode;
    openai_map_error(code, &status, &type, &ecode);
    http_req_finish(hr);
    if (!hr->started) {
        ollama_send_error(hr->h, hr->wc, hr->route, status, msg);
        return;
    }
    /* The stream has begun with 200: the error is its last line, as ollama ends one. */
    json_object *o = json_object_new_object();
    if (o) {
        json_object_object_add(o, "error", json_object_new_string(msg));
        evbuffer_add_printf(hr->sse, "%s\n", http_json_text(o));
        json_object_put(o);
    }
    httpwire_stream_chunk(hr->wc, hr->sse);
    httpwire_stream_end(hr->wc);
}

/* Answers 400 with msg (hr is over). */
static void bad_request(hreq *hr, const char *msg)
{
    ollama_finish_error(hr, LLMS__ERROR_CODE__INVALID_ARGUMENT, msg);
}

/* ---- models ---- */

/* The model of h's view that name means: a registry name, or one with ":latest" after it
 * (ollama's clients name models with a tag; a registry model has one version). As ollama
 * finds them, a name of other case means the one model it names but for case; with two
 * such, only the exact name does. */
static const models_view_entry *find_tagged(const http *h, const char *name)
{
    size_t n = strlen(name), k = strlen(SUFFIX_LATEST);
    if (n > k && strcasecmp(name + n - k, SUFFIX_LATEST) == 0)
        n -= k;
    const models_view_entry *folded = NULL;
    int n_folded = 0;
    for (size_t i = 0; i < h->view.n; i++) {
        const char *e = h->view.entries[i].name;
        if (strlen(e) != n)
            continue;
        if (memcmp(e, name, n) == 0)
            return &h->view.entries[i];
        if (strncasecmp(e, name, n) == 0) {
            folded = &h->view.entries[i];
            n_folded++;
        }
    }
    return n_folded == 1 ? folded : NULL;
}

int ollama_request_model(http *h, httpwire_conn *wc, enum route r, json_object *body,
                         const char **named, const models_view_entry **e)
{
    json_object *m;
    bool embed = r == R_OLLAMA_EMBED || r == R_OLLAMA_EMBEDDINGS;
    *named = NULL;
    *e = http_view_default(h, embed ? MODELS_EMBED : MODELS_GENERATE);
    /* "name" is what older clients send (ollama reads it too) */
    if (!(json_object_object_get_ex(body, "model", &m) && json_object_is_type(m, json_type_string)) &&
        !(json_object_object_get_ex(body, "name", &m) && json_object_is_type(m, json_type_string))) {
        if (r != R_OLLAMA_SHOW)
            return 0;
        ollama_send_error(h, wc, r, 400, "'model' is required");
        return -1;
    }
    const char *name = json_object_get_string(m);
    if (!(*e = find_tagged(h, name))) {
        char msg[320];
        snprintf(msg, sizeof msg, "model '%.200s' not found", name);
        ollama_send_error(h, wc, r, 404, msg);
        return -1;
    }
    *named = name;
    return 0;
}

/* The name a reply gives its model: as the request spelled it, else the default's. */
static const char *reply_model(const hreq *hr)
{
    return hr->model_named ? hr->model_named : hr->model;
}

/* A parameter count as ollama shows one: 21.3M, 8.0B. */
static void parameter_size(uint64_t n, char out[24])
{
    if (n >= 1000000000)
        snprintf(out, 24, "%.1fB", (double)n / 1e9);
    else if (n >= 1000000)
        snprintf(out, 24, "%.1fM", (double)n / 1e6);
    else if (n >= 1000)
        snprintf(out, 24, "%.1fK", (double)n / 1e3);
    else
        snprintf(out, 24, "%llu", (unsigned long long)n);
}

/* A model's "details": what its file says of itself. */
static json_object *details_obj(const models_view_entry *e)
{
    json_object *d = json_object_new_object(), *families = json_object_new_array();
    char ps[24];
    if (!d || !families) {
        json_object_put(d);
        json_object_put(families);
        return NULL;
    }
    parameter_size(e->n_params, ps);
    json_object_array_add(families, json_object_new_string(e->arch));
    json_object_object_add(d, "parent_model", json_object_new_string(""));
    json_object_object_add(d, "format", json_object_new_string("gguf"));
    json_object_object_add(d, "family", json_object_new_string(e->arch));
    json_object_object_add(d, "families", families);
    json_object_object_add(d, "parameter_size", json_object_new_string(ps));
    json_object_object_add(d, "quantization_level", json_object_new_string(e->quant));
    return d;
}

/* A model of /api/tags (ps: of /api/ps). There is no digest to give: ollama's is the
 * hash of a manifest in its store, and llmsd's models are files the settings name, so it
 * is "" rather than a hash that would pass for one. */
static json_object *model_obj(const models_view_entry *e, bool ps)
{
    json_object *m = json_object_new_object();
    char name[MODELS_NAME_MAX + sizeof SUFFIX_LATEST], when[48];
    if (!m)
        return NULL;
    snprintf(name, sizeof name, "%s" SUFFIX_LATEST, e->name);
    json_object_object_add(m, "name", json_object_new_string(name));
    json_object_object_add(m, "model", json_object_new_string(name));
    json_object_object_add(m, "size", json_object_new_int64((int64_t)e->file_bytes));
    json_object_object_add(m, "digest", json_object_new_string(""));
    json_object_object_add(m, "details", details_obj(e));
    if (ps) {
        /* loaded until the daemon exits or llmsctl unloads it: no time of its own */
        json_object_object_add(m, "expires_at", json_object_new_string("9999-12-31T23:59:59Z"));
        /* the gateway does not know where the weights are: none is claimed */
        json_object_object_add(m, "size_vram", json_object_new_int64(0));
    } else {
        rfc3339(e->file_mtime, -1, when);
        json_object_object_add(m, "modified_at", json_object_new_string(when));
    }
    return m;
}

void ollama_send_info(http *h, httpwire_conn *wc, enum route r)
{
    json_object *o = json_object_new_object(), *models = NULL;
    if (o && r == R_OLLAMA_VERSION) {
        json_object_object_add(o, "version", json_object_new_string(LLMS_VERSION));
    } else if (o && (models = json_object_new_array())) {
        /* every model ollama's clients can use (generate or embed); all of them are loaded */
        for (size_t i = 0; i < h->view.n; i++) {
            const models_view_entry *e = &h->view.entries[i];
            if (!(e->roles & (MODELS_GENERATE | MODELS_EMBED)))
                continue;
            json_object *m = model_obj(e, r == R_OLLAMA_PS);
            if (!m || json_object_array_add(models, m)) {
                json_object_put(m);
                json_object_put(o);
                o = NULL;
                break;
            }
        }
        json_object_object_add(o, "models", models);
    } else {
        json_object_put(o);
        o = NULL;
    }
    if (!o)
        json_object_put(models);
    http_send_json(h, wc, r, 200, o);
}

void ollama_send_show(http *h, httpwire_conn *wc, const models_view_entry *e)
{
    json_object *o = json_object_new_object(), *info = json_object_new_object(),
                *caps = json_object_new_array();
    char when[48], key[64];
    if (!o || !info || !caps) {
        json_object_put(o);
        json_object_put(info);
        json_object_put(caps);
        http_send_json(h, wc, R_OLLAMA_SHOW, 500, NULL);
        return;
    }
    json_object_object_add(info, "general.architecture", json_object_new_string(e->arch));
    json_object_object_add(info, "general.parameter_count",
                           json_object_new_int64((int64_t)e->n_params));
    if (e->roles & MODELS_GENERATE) {
        /* the window a request has (n_ctx), which clients size their prompts by */
        snprintf(key, sizeof key, "%s.context_length", e->arch);
        json_object_object_add(info, key, json_object_new_int(h->cfg->n_ctx));
        json_object_array_add(caps, json_object_new_string("completion"));
    }
    if (e->roles & MODELS_EMBED)
        json_object_array_add(caps, json_object_new_string("embedding"));
    if ((e->roles & MODELS_GENERATE) && chat_thinking(e->family) != CHAT_THINK_NONE)
        json_object_array_add(caps, json_object_new_string("thinking"));
    rfc3339(e->file_mtime, -1, when);
    /* no Modelfile or parameters of ollama's: the settings and llmsctl configure llmsd */
    json_object_object_add(o, "modelfile", json_object_new_string(""));
    json_object_object_add(o, "parameters", json_object_new_string(""));
    /* the chat template family (chatml, llama3, ...): a chat is rendered with it */
    json_object_object_add(o, "template", json_object_new_string(chat_family_name(e->family)));
    json_object_object_add(o, "details", details_obj(e));
    json_object_object_add(o, "model_info", info);
    json_object_object_add(o, "capabilities", caps);
    json_object_object_add(o, "modified_at", json_object_new_string(when));
    http_send_json(h, wc, R_OLLAMA_SHOW, 200, o);
}

void ollama_refuse_manage(http *h, httpwire_conn *wc)
{
    /* 403: refused as a matter of policy, so clients show the message and do not retry */
    ollama_send_error(h, wc, R_OLLAMA_MANAGE, 403,
                      "llmsd serves the models its settings name and does not pull, push, "
                      "create, copy or delete models: an admin adds one with 'llmsctl load "
                      "NAME PATH' (a GGUF file) or a model.NAME line of the settings");
}

/* ---- reading requests ---- */

/* The fields of a request (or of a chat message, where) that ask for what llmsd does not
 * produce, refused naming the field (a chat's tools and its messages' tool_calls are
 * toolcall.c's; /api/generate's tools are refused apart, its suffix is
 * fill_in_the_middle's). 0, or -1 with msg. */
static int refuse_unproduced(json_object *o, const char *where, char *msg, size_t cap)
{
    static const struct {
        const char *field, *why;
    } asks[] = {
        {"images", "images are not supported (no vision models)"},
        {"template", "a request's own template is not supported (the model's chat template "
                     "renders it)"},
        {"context", "context tokens are not returned or taken: send the conversation to "
                    "/api/chat"},
    };
    json_object *v;
    for (size_t i = 0; i < sizeof asks / sizeof asks[0]; i++)
        if (json_object_object_get_ex(o, asks[i].field, &v) && !jsonfield_asks_nothing(v)) {
            snprintf(msg, cap, "'%s%s': %s", where, asks[i].field, asks[i].why);
            return -1;
        }
    return 0;
}

/* ollama's "format" into p: "json" is JSON mode, an object the JSON Schema the reply
 * follows (its text lives in body; the session refuses one the engine cannot enforce).
 * 0, or -1 with msg. */
static int read_format(json_object *body, Llms__GenerationParams *p, char *msg, size_t cap)
{
    json_object *v;
    if (!json_object_object_get_ex(body, "format", &v) || jsonfield_asks_nothing(v))
        return 0;
    if (json_object_is_type(v, json_type_object)) {
        p->has_format = 1;
        p->format = LLMS__RESPONSE_FORMAT__FORMAT_JSON_SCHEMA;
        p->json_schema = (char *)http_json_text(v);
        return 0;
    }
    if (json_object_is_type(v, json_type_string) && strcmp(json_object_get_string(v), "json") == 0) {
        p->has_format = 1;
        p->format = LLMS__RESPONSE_FORMAT__FORMAT_JSON_OBJECT;
        return 0;
    }
    snprintf(msg, cap, "'format': \"json\" or a JSON Schema object");
    return -1;
}

/* ollama's "think" into hr, as current ollama reads it: absent (or null), a thinking model
 * (one whose template has the think markers) thinks and its reasoning comes apart, unless
 * the daemon's reasoning_format is none; true asks for that (400 for a model that does not
 * think, in ollama's words), false renders the template's switch off and leaves the
 * reply's text whole; a level ("low", "medium", "high") is gpt-oss's alone, its reasoning
 * effort, and gpt-oss reads past true and false. A forced tool call is split by
 * nothing. 0, or -1 with msg. */
static int read_think(hreq *hr, char *msg, size_t cap)
{
    json_object *v;
    bool thinks = chat_thinking(hr->family) != CHAT_THINK_NONE;
    hr->reasoning = thinks && strcmp(hr->h->cfg->reasoning_format, "none");
    if (!json_object_object_get_ex(hr->body, "think", &v) || json_object_is_type(v, json_type_null))
        return 0;
    bool harmony = chat_thinking(hr->family) == CHAT_THINK_HARMONY;
    if (json_object_is_type(v, json_type_string) &&
        !(harmony && chat_harmony_effort_valid(json_object_get_string(v)))) {
        snprintf(msg, cap, "think value \"%.32s\" is not supported for this model",
                 json_object_get_string(v));
        return -1;
    }
    /* gpt-oss thinks at a level, its reasoning apart; it cannot not think, and ollama
     * reads past true and false for it */
    if (harmony) {
        if (json_object_is_type(v, json_type_string))
            hr->effort = json_object_get_string(v);
        return 0;
    }
    if (!json_object_is_type(v, json_type_boolean)) {
        snprintf(msg, cap, "'think' must be true or false");
        return -1;
    }
    bool think = json_object_get_boolean(v);
    if (think && !thinks) {
        snprintf(msg, cap, "\"%.200s\" does not support thinking", reply_model(hr));
        return -1;
    }
    hr->reasoning = think;
    hr->no_thinking = !think;
    return 0;
}

/* An options integer. ollama reads every option number as a float64 and takes an
 * integer option's whole part, so 4.0 (as Python's json writes a float) is 4; a number
 * beyond int64 is refused. */
static int int_option(json_object *opts, const char *key, int64_t *out, char *msg, size_t cap)
{
    json_object *v;
    int rc = jsonfield_get(opts, key, "options.", json_type_double, &v, msg, cap);
    if (rc == 1 && json_object_is_type(v, json_type_double)) {
        double d = json_object_get_double(v);
        if (!(d > -9223372036854775808.0 && d < 9223372036854775808.0)) {
            snprintf(msg, cap, "'options.%s' must be an integer", key);
            return -1;
        }
        *out = (int64_t)d;
    } else if (rc == 1) {
        *out = json_object_get_int64(v);
    }
    return rc;
}

static int32_t clamp32(int64_t v)
{
    return v < INT32_MIN ? INT32_MIN : v > INT32_MAX ? INT32_MAX : (int32_t)v;
}

/* A number option into *value, with *has set: 1 read, 0 absent, -1 (msg). */
static int float_option(json_object *opts, const char *key, protobuf_c_boolean *has,
                        float *value, char *msg, size_t cap)
{
    json_object *v;
    int rc = jsonfield_get(opts, key, "options.", json_type_double, &v, msg, cap);
    if (rc == 1)
        *has = 1, *value = (float)json_object_get_double(v);
    return rc;
}

/* ollama's options of llama.cpp's other samplers into p: mirostat (0, 1, 2),
 * mirostat_tau, mirostat_eta and typical_p (above 1, llama.cpp's off, is 1). Ranges are
 * the session's to check. 0, or -1 with msg. */
static int read_sampler_options(json_object *opts, Llms__GenerationParams *p, char *msg,
                                size_t cap)
{
    int64_t n;
    int rc = int_option(opts, "mirostat", &n, msg, cap);
    if (rc < 0 ||
        float_option(opts, "mirostat_tau", &p->has_mirostat_tau, &p->mirostat_tau, msg, cap) < 0 ||
        float_option(opts, "mirostat_eta", &p->has_mirostat_eta, &p->mirostat_eta, msg, cap) < 0 ||
        float_option(opts, "typical_p", &p->has_typical_p, &p->typical_p, msg, cap) < 0)
        return -1;
    if (rc)
        p->has_mirostat = 1, p->mirostat = clamp32(n);
    if (p->has_typical_p && p->typical_p > 1)
        p->typical_p = 1;
    return 0;
}

/* ollama's "options" into p (stop strings point into the body; p->stop has room for
 * max_stops). What only concerns how ollama runs a model (num_gpu, num_thread, num_batch,
 * use_mmap, ...) and names it does not know are ignored, as ollama ignores unknown ones;
 * tail-free sampling is refused unless off. 0, or -1 with msg. */
static int read_options(const hreq *hr, Llms__GenerationParams *p, size_t max_stops,
                        char *msg, size_t cap)
{
    json_object *opts, *v;
    int64_t n = 0;
    int rc = jsonfield_get(hr->body, "options", "", json_type_object, &opts, msg, cap);
    if (rc <= 0)
        return rc;
    if (jsonfield_sampling_floats(opts, "options.", p, msg, cap) < 0)
        return -1;
    if ((rc = int_option(opts, "top_k", &n, msg, cap)) < 0)
        return -1;
    /* ollama's (llama.cpp's) top_k <= 0 is off, the native 0 */
    if (rc)
        p->has_top_k = 1, p->top_k = n < 0 ? 0 : clamp32(n);
    if ((rc = int_option(opts, "repeat_last_n", &n, msg, cap)) < 0)
        return -1;
    /* ollama's -1 is the whole window, the native -1 the whole history: the same */
    if (rc && n < -1) {
        snprintf(msg, cap, "'options.repeat_last_n' must be -1 (the whole window) or more");
        return -1;
    }
    if (rc)
        p->has_repeat_last_n = 1, p->repeat_last_n = clamp32(n);
    if ((rc = int_option(opts, "seed", &n, msg, cap)) < 0)
        return -1;
    /* a negative seed is ollama's "random", as leaving it out */
    if (rc && n >= 0)
        p->has_seed = 1, p->seed = (uint64_t)n;
    int window = hr->h->cfg->n_ctx;
    if ((rc = int_option(opts, "num_predict", &n, msg, cap)) < 0)
        return -1;
    if (rc && n < -2) {
        snprintf(msg, cap, "'options.num_predict' must be a count, or -1, -2 or 0 (until the "
                           "window of %d tokens is full)", window);
        return -1;
    }
    /* -1 and 0 (ollama: no limit; its runner limits only a count > 0, and clients send 0
     * with their "load the model" calls) and -2 (fill the context) all end as the window
     * fills: a Complete's window does not slide */
    if (rc)
        p->has_max_tokens = 1, p->max_tokens = n <= 0 ? window : clamp32(n);
    /* The window is the daemon's (n_ctx), whatever num_ctx asks: ollama too caps a num_ctx
     * beyond what it can have rather than refusing it, and clients send theirs with every
     * request (Continue: 32768 by default). A prompt beyond the window is refused as ever. */
    if (int_option(opts, "num_ctx", &n, msg, cap) < 0)
        return -1;
    if (read_sampler_options(opts, p, msg, cap) < 0)
        return -1;
    /* llama.cpp has removed tail-free sampling: only its off value passes */
    if ((rc = jsonfield_get(opts, "tfs_z", "options.", json_type_double, &v, msg, cap)) < 0)
        return -1;
    if (rc && json_object_get_double(v) != 1) {
        snprintf(msg, cap, "'options.tfs_z': tail-free sampling is not supported (llama.cpp "
                           "has removed it; 1 is off)");
        return -1;
    }
    return jsonfield_stops(opts, "stop", "options.", p, max_stops, msg, cap);
}

/* The messages of a chat, checked for what llmsd does not produce; NULL with msg when
 * they are not an array of objects, or *none when there are none (absent or empty). */
static json_object *chat_messages(json_object *body, bool *none, char *msg, size_t cap)
{
    json_object *msgs;
    int rc = jsonfield_get(body, "messages", "", json_type_array, &msgs, msg, cap);
    *none = rc == 0 || (rc == 1 && json_object_array_length(msgs) == 0);
    if (rc <= 0)
        return NULL;
    for (size_t i = 0; i < json_object_array_length(msgs); i++) {
        json_object *m = json_object_array_get_idx(msgs, i);
        char where[32];
        snprintf(where, sizeof where, "messages[%zu].", i);
        if (!json_object_is_type(m, json_type_object)) {
            snprintf(msg, cap, "messages[%zu] must be an object", i);
            return NULL;
        }
        if (refuse_unproduced(m, where, msg, cap))
            return NULL;
    }
    return msgs;
}

/* ---- answers ---- */

/* The start of every line and answer of a generation: {"model", "created_at"}. */
static json_object *line_head(const hreq *hr)
{
    char now[48];
    json_object *o = json_object_new_object();
    if (!o)
        return NULL;
    now_rfc3339(now);
    json_object_object_add(o, "model", json_object_new_string(reply_model(hr)));
    json_object_object_add(o, "created_at", json_object_new_string(now));
    return o;
}

/* n bytes of reply text into o: a chat's "message", a generation's "response". */
static void add_text(const hreq *hr, json_object *o, const char *text, size_t n)
{
    json_object *s = json_object_new_string_len(text, (int)n);
    if (hr->route != R_OLLAMA_CHAT) {
        json_object_object_add(o, "response", s);
        return;
    }
    json_object *m = json_object_new_object();
    if (m) {
        json_object_object_add(m, "role", json_object_new_string("assistant"));
        json_object_object_add(m, "content", s);
        s = NULL;
    }
    json_object_put(s);
    json_object_object_add(o, "message", m);
}

/* n bytes of reasoning into o: a chat's message's "thinking" (after add_text made the
 * message), a generation's "thinking". */
static void add_thinking(const hreq *hr, json_object *o, const char *text, size_t n)
{
    json_object *m = o;
    if (hr->route == R_OLLAMA_CHAT && !json_object_object_get_ex(o, "message", &m))
        return;
    json_object_object_add(m, "thinking", json_object_new_string_len(text, (int)n));
}

/* ollama's answer to a "load the model" call (an empty prompt, no messages): done, with
 * nothing generated. Not streamed, as ollama answers it. */
static void answer_load(hreq *hr)
{
    http_req_finish(hr);
    json_object *o = line_head(hr);
    if (o) {
        add_text(hr, o, "", 0);
        json_object_object_add(o, "done", json_object_new_boolean(1));
        json_object_object_add(o, "done_reason", json_object_new_string("load"));
    }
    http_send_json(hr->h, hr->wc, hr->route, 200, o);
}

void ollama_stream_start(hreq *hr)
{
    if (hr->started)
        return;
    httpwire_add_header(hr->wc, "Content-Type", "application/x-ndjson");
    httpwire_add_header(hr->wc, "Cache-Control", "no-cache");
    httpwire_stream_start(hr->wc, 200);
    http_count_status(hr->h, hr->route, 200);
    hr->started = true;
}

/* ollama's tool_calls of a message: [{"function": {"name", "arguments": object}}]. */
static json_object *ollama_tool_calls(json_object *calls)
{
    json_object *list = json_object_new_array();
    for (size_t i = 0; list && i < json_object_array_length(calls); i++) {
        json_object *c = json_object_array_get_idx(calls, i), *e = json_object_new_object(),
                    *fn = json_object_new_object(), *v;
        if (!e || !fn) {
            json_object_put(e);
            json_object_put(fn);
            continue;
        }
        if (json_object_object_get_ex(c, "name", &v))
            json_object_object_add(fn, "name", json_object_get(v));
        if (json_object_object_get_ex(c, "arguments", &v))
            json_object_object_add(fn, "arguments", json_object_get(v));
        json_object_object_add(e, "function", fn);
        json_object_array_add(list, e);
    }
    return list;
}

/* One line of hr's stream: n bytes of text, the calls found with them (or NULL), or
 * (thinking) n bytes of reasoning with no text. */
static void stream_line(hreq *hr, const char *text, size_t n, json_object *calls, bool thinking)
{
    json_object *o = line_head(hr), *m;
    if (!o)
        return;
    add_text(hr, o, thinking ? "" : text, thinking ? 0 : n);
    if (thinking)
        add_thinking(hr, o, text, n);
    if (calls && json_object_array_length(calls) && json_object_object_get_ex(o, "message", &m))
        json_object_object_add(m, "tool_calls", ollama_tool_calls(calls));
    json_object_object_add(o, "done", json_object_new_boolean(0));
    evbuffer_add_printf(hr->sse, "%s\n", http_json_text(o));
    json_object_put(o);
    httpwire_stream_chunk(hr->wc, hr->sse);
}

/* Feeds n bytes of reply (end: the last) to hr's scan and streams what it decides. */
static void stream_scanned(hreq *hr, const char *text, size_t n, bool end)
{
    toolcall_out out;
    if (toolcall_scan_feed(hr->scan, text, n, end, &out) == 0 &&
        (out.content_len || json_object_array_length(out.calls)))
        stream_line(hr, out.content ? out.content : "", out.content_len, out.calls, false);
    toolcall_out_free(&out);
}

/* Streams n bytes of the reply's content (end: its last ones), through hr's scan when it
 * has one. */
static void stream_content(hreq *hr, const char *text, size_t n, bool end)
{
    if (hr->scan)
        stream_scanned(hr, text, n, end);
    else if (n)
        stream_line(hr, text, n, NULL, false);
}

/* A run of the split: a line of thinking, or content. */
static int stream_run(void *arg, bool reasoning, const char *text, size_t n)
{
    hreq *hr = arg;
    if (reasoning)
        stream_line(hr, text, n, NULL, true);
    else
        stream_content(hr, text, n, false);
    return 0;
}

/* Streams n bytes of the reply (end: its last ones): through its split when its reasoning
 * comes apart, lines of thinking and then of content. */
static void stream_reply(hreq *hr, const char *text, size_t n, bool end)
{
    if (!hr->reasoning) {
        stream_content(hr, text, n, end);
        return;
    }
    reasoning_feed_each(&hr->choices[0].split, text, n, end, stream_run, hr);
    if (end)
        stream_content(hr, "", 0, true);
}

void ollama_stream_text(hreq *hr, const char *text, size_t n)
{
    stream_reply(hr, text, n, false);
    hr->choices[0].sent += n;
}

void ollama_on_result(hreq *hr, const Llms__CallResult *res)
{
    http *h = hr->h;
    h->prompt_tokens += res->prompt_tokens;
    h->cached_tokens += res->has_cached_tokens ? res->cached_tokens : 0;
    h->completion_tokens += res->generated_tokens;
    http_req_finish(hr);
    size_t len = strlen(res->text);
    toolcall_out out = {0};
    reasoning_span r = {true, res->text, 0}, c = {false, res->text, len};
    if (hr->stream) {
        ollama_stream_start(hr);
        /* text of chunks dropped for a slow reader (or none), and what was held back */
        size_t sent = hr->reasoning ? reasoning_fed(&hr->choices[0].split) : hr->choices[0].sent;
        size_t from = sent < len ? sent : len;
        stream_reply(hr, res->text + from, len - from, true);
    } else {
        if (openai_split_whole(hr, res->text, &r, &c) < 0 ||
            (hr->scan && toolcall_scan_feed(hr->scan, c.text, c.n, true, &out) < 0)) {
            toolcall_out_free(&out);
            ollama_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
            return;
        }
    }
    json_object *o = line_head(hr), *m;
    if (o) {
        /* streamed, the text has gone in the lines before: the last one has none */
        if (hr->stream)
            add_text(hr, o, "", 0);
        else if (hr->scan)
            add_text(hr, o, out.content ? out.content : "", out.content_len);
        else
            add_text(hr, o, c.text, c.n);
        if (r.n)
            add_thinking(hr, o, r.text, r.n);
        if (out.calls && json_object_array_length(out.calls) &&
            json_object_object_get_ex(o, "message", &m))
            json_object_object_add(m, "tool_calls", ollama_tool_calls(out.calls));
        json_object_object_add(o, "done", json_object_new_boolean(1));
        json_object_object_add(o, "done_reason",
                               json_object_new_string(openai_finish_reason(res->stop_reason)));
        /* the daemon's own times: queued, then prefill and decode; models stay loaded */
        json_object_object_add(o, "total_duration",
                               nanoseconds(res->queue_ms + res->prefill_ms + res->decode_ms));
        json_object_object_add(o, "load_duration", json_object_new_int64(0));
        json_object_object_add(o, "prompt_eval_count", json_object_new_int64(res->prompt_tokens));
        json_object_object_add(o, "prompt_eval_duration", nanoseconds(res->prefill_ms));
        json_object_object_add(o, "eval_count", json_object_new_int64(res->generated_tokens));
        json_object_object_add(o, "eval_duration", nanoseconds(res->decode_ms));
    }
    toolcall_out_free(&out);
    if (!hr->stream) {
        http_send_json(h, hr->wc, hr->route, 200, o);
        return;
    }
    if (o)
        evbuffer_add_printf(hr->sse, "%s\n", http_json_text(o));
    else
        evbuffer_add_printf(hr->sse, "{\"error\":\"out of memory\"}\n");
    json_object_put(o);
    httpwire_stream_chunk(hr->wc, hr->sse);
    httpwire_stream_end(hr->wc);
}

/* A message of role and text, appended to msgs (one whose strings ran out of memory is
 * refused by the rendering). -1 out of memory. */
static int add_message(json_object *msgs, const char *role, const char *text)
{
    json_object *m = json_object_new_object();
    if (!m)
        return -1;
    json_object_object_add(m, "role", json_object_new_string(role));
    json_object_object_add(m, "content", json_object_new_string(text));
    if (json_object_array_add(msgs, m) < 0) {
        json_object_put(m);
        return -1;
    }
    return 0;
}

/* A generate's prompt (after its system message, when there is one) as gpt-oss's chat
 * renders the conversation, at hr's effort. Fresh string, or NULL with msg. */
static char *generate_harmony(hreq *hr, const char *system, const char *prompt, char *msg,
                              size_t cap)
{
    json_object *msgs = json_object_new_array();
    if (!msgs || (system && add_message(msgs, "system", system) < 0) ||
        add_message(msgs, "user", prompt) < 0) {
        json_object_put(msgs);
        snprintf(msg, cap, "out of memory");
        return NULL;
    }
    /* a generate reads no tools: the set is empty, of the model's family */
    hr->tools.family = hr->family;
    char *out = openai_render_chat(hr, msgs, msg, cap);
    json_object_put(msgs);
    return out;
}

/* The Complete of an /api/generate body, its prompt as ollama means it: raw, through the
 * chat template with a system message, a fill in the middle with a suffix (**part_ptr),
 * or gpt-oss's rendered here (*rendered, its end of turn one more stop string of gp).
 * -1 with msg; 1: an empty prompt, ollama's "load the model" call. */
static int generate_request(hreq *hr, Llms__CompleteRequest *cr, Llms__PromptPart **part_ptr,
                            Llms__GenerationParams *gp, char **rendered, char *msg, size_t cap)
{
    json_object *v;
    int rc;
    const char *prompt = "", *system = NULL, *suffix = NULL;
    if ((rc = jsonfield_get(hr->body, "prompt", "", json_type_string, &v, msg, cap)) < 0)
        return -1;
    if (rc)
        prompt = json_object_get_string(v);
    if ((rc = jsonfield_get(hr->body, "suffix", "", json_type_string, &v, msg, cap)) < 0)
        return -1;
    if (rc && json_object_get_string_len(v))
        suffix = json_object_get_string(v);
    if ((rc = jsonfield_get(hr->body, "system", "", json_type_string, &v, msg, cap)) < 0)
        return -1;
    if (rc && json_object_get_string_len(v))
        system = json_object_get_string(v);
    if ((rc = jsonfield_get(hr->body, "raw", "", json_type_boolean, &v, msg, cap)) < 0)
        return -1;
    bool raw = rc && json_object_get_boolean(v);
    if (raw && system) {
        snprintf(msg, cap, "'system' goes through the chat template, which 'raw' leaves out");
        return -1;
    }
    /* ollama's templates of code models write a suffix's prompt without the system
     * message, and a raw prompt without the suffix: neither would be honoured */
    if (suffix && (raw || system)) {
        snprintf(msg, cap, "'%s': a prompt with a suffix is the model's fill-in-the-middle "
                 "prompt, which has no place for it", raw ? "raw" : "system");
        return -1;
    }
    /* an empty prompt is ollama's "load the model" call, a system prompt or not */
    if (!prompt[0])
        return 1;
    if (suffix) {
        if (fimreq_prompt_part(hr, prompt, suffix, *part_ptr, msg, cap))
            return -1;
        cr->prompt = "";
        cr->prompt_parts = part_ptr;
        cr->n_prompt_parts = 1;
        hr->reasoning = false; /* a fill in the middle is code, not a chat's reply */
    } else if (!raw && hr->family == CHAT_GPT_OSS) {
        /* gpt-oss's prompt holds the think level, its reasoning effort, which the
         * worker's rendering has no place for: rendered here, as /api/chat is */
        if (!(*rendered = generate_harmony(hr, system, prompt, msg, cap)))
            return -1;
        gp->stop[gp->n_stop++] = (char *)chat_stop_text(hr->family);
        cr->prompt = *rendered;
    } else {
        /* not raw: the prompt is the user's turn, through the model's chat template;
         * raw, it is no chat, and its text is left whole */
        cr->prompt = (char *)prompt;
        cr->system_prompt = (char *)system;
        cr->has_chat = 1;
        cr->chat = !raw;
        cr->has_enable_thinking = hr->no_thinking && !raw;
        cr->enable_thinking = !hr->no_thinking;
        hr->reasoning &= !raw;
    }
    return 0;
}

void ollama_start_generate(hreq *hr, Llms__Request *r, char *msg, size_t cap)
{
    bool chat = hr->route == R_OLLAMA_CHAT;
    const char *stops[STOP_MAX];
    Llms__GenerationParams gp = LLMS__GENERATION_PARAMS__INIT;
    Llms__CompleteRequest cr = LLMS__COMPLETE_REQUEST__INIT;
    Llms__PromptPart part = LLMS__PROMPT_PART__INIT, *part_ptr = &part;
    json_object *v, *msgs = NULL;
    char *rendered = NULL;
    gp.stop = (char **)stops;
    int rc = jsonfield_get(hr->body, "stream", "", json_type_boolean, &v, msg, cap);
    if (rc < 0)
        goto bad;
    /* ollama streams unless told not to */
    hr->stream = rc == 0 || json_object_get_boolean(v);
    /* The matcher keeps one place for the chat template's end text (session.c), and a
     * chat rendered here carries that end of turn as one more stop string. */
    bool rendered_here = chat || hr->family == CHAT_GPT_OSS;
    if (refuse_unproduced(hr->body, "", msg, cap) || read_format(hr->body, &gp, msg, cap) ||
        read_options(hr, &gp, STOP_MAX - 1 - (rendered_here ? 1 : 0), msg, cap) ||
        read_think(hr, msg, cap))
        goto bad;
    if (!chat && json_object_object_get_ex(hr->body, "tools", &v) && !jsonfield_asks_nothing(v)) {
        snprintf(msg, cap, "'tools': tool calls are for /api/chat");
        goto bad;
    }
    if (chat && (toolcall_read(hr->body, hr->family, &hr->tools, msg, cap) < 0 ||
                 toolcall_constrain(&hr->tools, &gp, msg, cap) < 0))
        goto bad;
    openai_split_start(hr);
    if (chat) {
        bool none;
        if (!(msgs = chat_messages(hr->body, &none, msg, cap)) && !none)
            goto bad;
        if (none) {
            answer_load(hr);
            return;
        }
        if (!(rendered = openai_render_chat(hr, msgs, msg, cap)))
            goto bad;
        stops[gp.n_stop++] = chat_stop_text(hr->family);
        cr.prompt = rendered;
    } else {
        int got = generate_request(hr, &cr, &part_ptr, &gp, &rendered, msg, cap);
        if (got < 0)
            goto bad;
        if (got == 1) {
            answer_load(hr);
            return;
        }
    }
    cr.params = &gp;
    cr.model = hr->model[0] ? hr->model : NULL;
    if (hr->stream && !(hr->sse = evbuffer_new())) {
        free(rendered);
        free(part.tokens);
        ollama_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    r->body_case = LLMS__REQUEST__BODY_COMPLETE;
    r->complete = &cr;
    /* packed into a request of its own: the prompt's tokens are not needed after */
    http_submit(hr, r);
    free(rendered);
    free(part.tokens);
    return;
bad:
    bad_request(hr, msg);
}

void ollama_start_embed(hreq *hr, Llms__Request *r, char *msg, size_t cap)
{
    bool legacy = hr->route == R_OLLAMA_EMBEDDINGS;
    json_object *in, *v;
    int rc;
    if (jsonfield_get(hr->body, "truncate", "", json_type_boolean, &v, msg, cap) < 0)
        goto bad;
    if ((rc = jsonfield_get(hr->body, "dimensions", "", json_type_int, &v, msg, cap)) < 0)
        goto bad;
    if (rc && (json_object_get_int64(v) < 1 || json_object_get_int64(v) > UINT32_MAX)) {
        snprintf(msg, cap, "'dimensions' must be a positive integer");
        goto bad;
    }
    hr->dimensions = rc ? (uint32_t)json_object_get_int64(v) : 0;
    const char *key = legacy ? "prompt" : "input";
    bool present = json_object_object_get_ex(hr->body, key, &in) &&
                   !json_object_is_type(in, json_type_null);
    bool one = present && json_object_is_type(in, json_type_string);
    size_t n = one ? 1 : present && json_object_is_type(in, json_type_array)
                             ? json_object_array_length(in) : 0;
    if (present && !one && (legacy || !json_object_is_type(in, json_type_array))) {
        snprintf(msg, cap, legacy ? "'prompt' must be a string"
                                  : "'input' must be a string or an array of strings");
        goto bad;
    }
    /* Nothing to embed (ollama's "load the model" call, or an empty legacy prompt): an
     * empty answer, as ollama gives it. */
    if (n == 0 || (legacy && json_object_get_string_len(in) == 0)) {
        http_req_finish(hr);
        json_object *o = json_object_new_object();
        if (o && legacy) {
            json_object_object_add(o, "embedding", json_object_new_array());
        } else if (o) {
            json_object_object_add(o, "model", json_object_new_string(reply_model(hr)));
            json_object_object_add(o, "embeddings", json_object_new_array());
        }
        http_send_json(hr->h, hr->wc, hr->route, 200, o);
        return;
    }
    const char **texts;
    if ((rc = jsonfield_strings(in, &texts, &n)) == -2) {
        ollama_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    if (rc < 0) {
        snprintf(msg, cap, "'input' must be a string or an array of strings");
        goto bad;
    }
    Llms__EmbedRequest e = LLMS__EMBED_REQUEST__INIT;
    e.texts = (char **)texts;
    e.n_texts = n;
    e.model = hr->model[0] ? hr->model : NULL;
    r->body_case = LLMS__REQUEST__BODY_EMBED;
    r->embed = &e;
    http_submit(hr, r);
    free(texts);
    return;
bad:
    bad_request(hr, msg);
}

void ollama_on_embed(hreq *hr, const Llms__EmbedResponse *e)
{
    http *h = hr->h;
    http_req_finish(hr);
    char msg[MODELS_NAME_MAX + 160];
    if (http_embed_dimensions_differ(hr, e, msg, sizeof msg)) {
        ollama_send_error(h, hr->wc, hr->route, 400, msg);
        return;
    }
    uint64_t tokens = 0;
    for (size_t i = 0; i < e->n_n_tokens; i++)
        tokens += e->n_tokens[i];
    h->embed_tokens += tokens;
    json_object *o = json_object_new_object(), *embs = NULL;
    if (o && hr->route == R_OLLAMA_EMBEDDINGS) {
        json_object_object_add(o, "embedding",
                               e->n_vectors ? http_vector_json(e->vectors[0])
                                            : json_object_new_array());
    } else if (o && (embs = json_object_new_array())) {
        for (size_t i = 0; i < e->n_vectors; i++)
            json_object_array_add(embs, http_vector_json(e->vectors[i]));
        json_object_object_add(o, "model", json_object_new_string(reply_model(hr)));
        json_object_object_add(o, "embeddings", embs);
        json_object_object_add(o, "prompt_eval_count", json_object_new_int64((int64_t)tokens));
    } else {
        json_object_put(o);
        o = NULL;
    }
    http_send_json(h, hr->wc, hr->route, 200, o);
}
