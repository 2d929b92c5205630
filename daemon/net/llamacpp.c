/*
 * llamacpp.c — llama.cpp's server's own API on the gateway (http.h), for the scripts and
 * tools written against llama-server rather than OpenAI's routes: POST /completion (and
 * its alias /completions) becomes a native Complete of the raw prompt (a string, token
 * ids, or strings and ids mixed: CompleteRequest.prompt_parts), answered whole or as
 * Server-Sent Events in llama.cpp's shapes; POST /infill lays out a fill-in-the-middle
 * prompt (daemon/infill.h) with the default generate model's tokenizer, which the
 * gateway holds, and runs its token ids as /completion runs them, with the same fields
 * and answers; POST /apply-template gives the prompt the chat route renders (openai.c's
 * rendering, answered on the loop); POST /embedding (and /embeddings) gives the native
 * Embed's vectors, as /v1/embeddings sends it, in llama.cpp's own shape; GET /props
 * shows the daemon's defaults; /slots (GET, and POST /slots/{id_slot}'s actions) is
 * refused 501 as llama.cpp's server refuses it unless started with --slots
 * (--slot-save-path). Errors are llama.cpp's {"error": {"code", "message", "type"}}.
 *
 * Its samplers are llmsd's (engine/model/sampler.h), their fields and the samplers order
 * read by llamaparams.c. What only concerns how llama.cpp's server runs (id_slot,
 * cache_prompt: llmsd's prompt cache is always on; n_keep and n_discard: a Complete's
 * window never shifts, a reply that fills it ends truncated; timings_per_token, the
 * speculative settings) is read past. What would change the reply and cannot be honoured
 * (tail-free sampling, which llama.cpp has removed too, n_indent, t_max_predict_ms,
 * post-sampling probabilities, images, LoRA adapters, the infill sampler, texts in
 * logit_bias, several prompts) is refused naming the field, as the other routes refuse
 * theirs: a reply that ignored them would pass for one that honoured them.
 */
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/infill.h"
#include "daemon/net/http_internal.h"
#include "daemon/net/jsonfield.h"
#include "daemon/net/llamaparams.h"
#include "engine/model/logprob.h"
#include "engine/model/sampler.h"
#include "engine/tok/chat.h"
#include "engine/tok/stop.h"
#include "engine/tok/utf8.h"

/* llama.cpp's seed of "pick one at random" (LLAMA_DEFAULT_SEED), which its /props shows
 * and clients send back. */
#define RANDOM_SEED 4294967295LL

/* What a /completion asked that its answer repeats or shapes. Its pointers go into
 * hr->body and hr->bias, which live as long as the request. */
struct llamacpp_req {
    Llms__GenerationParams gp;  /* as submitted: the answer's generation_settings */
    char *stops[STOP_MAX];      /* gp.stop */
    llamaparams_lists lists;    /* gp's DRY breakers and samplers order */
    int64_t n_predict;          /* as asked (-1: until EOS or a full window) */
    int n_probs;                /* completion_probabilities' alternatives; 0: none */
    bool discard;               /* n_predict 0: the prompt is evaluated, nothing kept */
    bool return_tokens;
    const char *prompt;         /* a text prompt, which the answer repeats; NULL for ids */
    char *infill_prompt;        /* an infill's prompt as text (owned; prompt points to it) */
    size_t tokens_sent;         /* tokens whose stream events went out */
};

/* ---- errors ---- */

/* llama.cpp's error type of an HTTP status (its server's names; 429, which it never
 * answers, is OpenAI's). */
static const char *error_type(int status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 501: return "not_supported_error";
    case 503: return "unavailable_error";
    default: return status >= 400 && status < 500 ? "invalid_request_error" : "server_error";
    }
}

/* {"code", "message", "type"}: the inside of llama.cpp's error object. */
static json_object *error_obj(int status, const char *msg)
{
    json_object *e = json_object_new_object();
    if (e) {
        json_object_object_add(e, "code", json_object_new_int(status));
        json_object_object_add(e, "message", json_object_new_string(msg));
        json_object_object_add(e, "type", json_object_new_string(error_type(status)));
    }
    return e;
}

void llamacpp_send_error(http *h, httpwire_conn *wc, enum route r, int status, const char *msg)
{
    json_object *o = json_object_new_object(), *e = error_obj(status, msg);
    if (o && e) {
        json_object_object_add(o, "error", e);
        e = NULL;
    }
    json_object_put(e);
    http_send_json(h, wc, r, status, o);
}

void llamacpp_finish_error(hreq *hr, Llms__ErrorCode code, const char *msg)
{
    int status;
    const char *type, *ecode;
    openai_map_error(code, &status, &type, &ecode);
    http_req_finish(hr);
    if (!hr->started) {
        llamacpp_send_error(hr->h, hr->wc, hr->route, status, msg);
        return;
    }
    /* The stream has begun with 200: it ends with an "error:" line, as llama.cpp's
     * server ends one. */
    json_object *e = error_obj(status, msg);
    evbuffer_add_printf(hr->sse, "error: %s\n\n", e ? http_json_text(e) : "{}");
    json_object_put(e);
    httpwire_stream_chunk(hr->wc, hr->sse);
    httpwire_stream_end(hr->wc);
}

/* ---- settings ---- */

/* The samplers of p's chain as llama.cpp names them, in its order (every one when p
 * gives none). */
static json_object *samplers_json(const Llms__GenerationParams *p)
{
    json_object *a = json_object_new_array();
    size_t n = p->n_samplers ? p->n_samplers : LLAMAPARAMS_STEPS;
    for (size_t i = 0; a && i < n; i++)
        json_object_array_add(a, json_object_new_string(llamaparams_step_name(
                                     p->n_samplers ? p->samplers[i] : (Llms__SamplerStep)i)));
    return a;
}

/* DRY's breakers of p, llama.cpp's when it gives none. */
static json_object *breakers_json(const Llms__GenerationParams *p)
{
    json_object *a = json_object_new_array();
    size_t n = p->n_dry_sequence_breakers ? p->n_dry_sequence_breakers : DRYBREAK_N_DEFAULT;
    for (size_t i = 0; a && i < n; i++)
        json_object_array_add(a, json_object_new_string(p->n_dry_sequence_breakers
                                                            ? p->dry_sequence_breakers[i]
                                                            : drybreak_default[i]));
    return a;
}

/* llama.cpp's other samplers' settings of p into o, in llama.cpp's names: p's where it
 * sets them, else the daemon's (cfg). */
static void newer_settings_json(json_object *o, const config *cfg,
                                const Llms__GenerationParams *p)
{
    const struct {
        const char *name;
        bool has;
        double value, dflt;
    } numbers[] = {
        {"typical_p", p->has_typical_p, p->typical_p, cfg->typical_p},
        {"top_n_sigma", p->has_top_n_sigma, p->top_n_sigma, cfg->top_n_sigma},
        {"xtc_probability", p->has_xtc_probability, p->xtc_probability, cfg->xtc_probability},
        {"xtc_threshold", p->has_xtc_threshold, p->xtc_threshold, cfg->xtc_threshold},
        {"dynatemp_range", p->has_dynatemp_range, p->dynatemp_range, cfg->dynatemp_range},
        {"dynatemp_exponent", p->has_dynatemp_exponent, p->dynatemp_exponent,
         cfg->dynatemp_exponent},
        {"dry_multiplier", p->has_dry_multiplier, p->dry_multiplier, cfg->dry_multiplier},
        {"dry_base", p->has_dry_base, p->dry_base, cfg->dry_base},
        {"mirostat_tau", p->has_mirostat_tau, p->mirostat_tau, cfg->mirostat_tau},
        {"mirostat_eta", p->has_mirostat_eta, p->mirostat_eta, cfg->mirostat_eta},
    };
    for (size_t i = 0; i < sizeof numbers / sizeof *numbers; i++)
        json_object_object_add(o, numbers[i].name,
                               json_object_new_double(numbers[i].has ? numbers[i].value
                                                                     : numbers[i].dflt));
    int dry_last_n = p->has_dry_penalty_last_n ? p->dry_penalty_last_n : cfg->dry_penalty_last_n;
    json_object_object_add(o, "min_keep",
                           json_object_new_int(p->has_min_keep ? p->min_keep : cfg->min_keep));
    json_object_object_add(o, "dry_allowed_length",
                           json_object_new_int(p->has_dry_allowed_length
                                                   ? p->dry_allowed_length
                                                   : cfg->dry_allowed_length));
    /* -1 is the window, which llama.cpp shows */
    json_object_object_add(o, "dry_penalty_last_n",
                           json_object_new_int(dry_last_n < 0 ? cfg->n_ctx : dry_last_n));
    json_object_object_add(o, "dry_sequence_breakers", breakers_json(p));
    json_object_object_add(o, "mirostat",
                           json_object_new_int(p->has_mirostat ? p->mirostat : cfg->mirostat));
}

/* The settings a generation runs with, in llama.cpp's names: p's where it sets them,
 * else the daemon's defaults (cfg), else llama.cpp's. n_predict: as asked, or the
 * default. */
static json_object *settings_json(const config *cfg, const Llms__GenerationParams *p,
                                  int64_t n_predict, int n_probs, bool stream)
{
    json_object *o = json_object_new_object(), *stop = json_object_new_array(),
                *bias = json_object_new_array();
    if (!o || !stop || !bias) {
        json_object_put(o);
        json_object_put(stop);
        json_object_put(bias);
        return NULL;
    }
    int repeat_last_n = p->has_repeat_last_n ? p->repeat_last_n : cfg->repeat_last_n;
    json_object_object_add(o, "n_predict", json_object_new_int64(n_predict));
    json_object_object_add(o, "seed", json_object_new_int64(p->has_seed ? (int64_t)p->seed
                                                                          : RANDOM_SEED));
    json_object_object_add(o, "temperature", json_object_new_double(
                                                 p->has_temperature ? p->temperature
                                                                    : cfg->temperature));
    json_object_object_add(o, "top_k", json_object_new_int(p->has_top_k ? p->top_k : cfg->top_k));
    json_object_object_add(o, "top_p", json_object_new_double(p->has_top_p ? p->top_p
                                                                           : cfg->top_p));
    json_object_object_add(o, "min_p", json_object_new_double(p->has_min_p ? p->min_p
                                                                           : cfg->min_p));
    /* llmsd's -1 (the whole history) is at most the window, which llama.cpp shows */
    json_object_object_add(o, "repeat_last_n",
                           json_object_new_int(repeat_last_n < 0 ? cfg->n_ctx : repeat_last_n));
    json_object_object_add(o, "repeat_penalty",
                           json_object_new_double(p->has_repeat_penalty ? p->repeat_penalty
                                                                        : cfg->repeat_penalty));
    json_object_object_add(o, "presence_penalty",
                           json_object_new_double(p->has_presence_penalty
                                                      ? p->presence_penalty
                                                      : cfg->presence_penalty));
    json_object_object_add(o, "frequency_penalty",
                           json_object_new_double(p->has_frequency_penalty
                                                      ? p->frequency_penalty
                                                      : cfg->frequency_penalty));
    newer_settings_json(o, cfg, p);
    for (size_t i = 0; i < p->n_stop; i++)
        json_object_array_add(stop, json_object_new_string(p->stop[i]));
    json_object_object_add(o, "stop", stop);
    json_object_object_add(o, "max_tokens", json_object_new_int64(n_predict));
    json_object_object_add(o, "ignore_eos", json_object_new_boolean(p->ignore_eos));
    json_object_object_add(o, "stream", json_object_new_boolean(stream));
    for (size_t i = 0; i < p->n_logit_bias; i++) {
        json_object *e = json_object_new_array();
        if (!e)
            continue;
        json_object_array_add(e, json_object_new_int(p->logit_bias[i]->token));
        json_object_array_add(e, json_object_new_double(p->logit_bias[i]->bias));
        json_object_array_add(bias, e);
    }
    json_object_object_add(o, "logit_bias", bias);
    json_object_object_add(o, "n_probs", json_object_new_int(n_probs));
    json_object_object_add(o, "grammar", json_object_new_string(p->grammar ? p->grammar : ""));
    json_object_object_add(o, "samplers", samplers_json(p));
    json_object_object_add(o, "post_sampling_probs", json_object_new_boolean(0));
    return o;
}

void llamacpp_send_props(http *h, httpwire_conn *wc)
{
    const config *cfg = h->cfg;
    const models_view_entry *e = http_view_default(h, MODELS_GENERATE);
    Llms__GenerationParams none = LLMS__GENERATION_PARAMS__INIT;
    json_object *o = json_object_new_object(), *dflt = json_object_new_object();
    if (!o || !dflt) {
        json_object_put(o);
        json_object_put(dflt);
        llamacpp_send_error(h, wc, R_LLAMACPP_PROPS, 500, "out of memory");
        return;
    }
    json_object_object_add(dflt, "n_ctx", json_object_new_int(cfg->n_ctx));
    json_object_object_add(dflt, "params",
                           settings_json(cfg, &none, cfg->max_tokens, 0, false));
    json_object_object_add(o, "default_generation_settings", dflt);
    /* generations that run side by side, each a sequence of the batch */
    json_object_object_add(o, "total_slots", json_object_new_int(SCHED_MAX_ACTIVE));
    json_object_object_add(o, "model_path", json_object_new_string(e ? e->path : ""));
    /* the chat template's family (chatml, llama3, ...), which renders the chat routes */
    json_object_object_add(o, "chat_template",
                           json_object_new_string(e ? chat_family_name(e->family) : ""));
    json_object_object_add(o, "build_info", json_object_new_string(LLMS_VERSION));
    http_send_json(h, wc, R_LLAMACPP_PROPS, 200, o);
}

void llamacpp_refuse_props_change(http *h, httpwire_conn *wc)
{
    llamacpp_send_error(h, wc, R_LLAMACPP_PROPS, 501,
                        "This server does not support changing global properties (llama.cpp's "
                        "--props): llmsd's settings are its configuration file's");
}

/* Whether path is among the adapters of the adapter models over base that come before
 * the one of entry i that starts at start. */
static bool lora_seen(const http *h, const char *base, size_t i, const char *start,
                      const char *path)
{
    char seen[CONFIG_PATH_MAX], err[ERR_MAX];
    float scale;
    for (size_t j = 0; j <= i; j++) {
        const models_view_entry *o = &h->view.entries[j];
        if (strcmp(o->base, base) != 0)
            continue;
        for (const char *q = o->lora_spec;
             (j < i || q < start) && config_lora_next(&q, seen, &scale, err) == 1;)
            if (strcmp(seen, path) == 0)
                return true;
    }
    return false;
}

int llamacpp_lora_each(const http *h, bool (*fn)(void *arg, int id, const char *path),
                       void *arg)
{
    const models_view_entry *dflt = http_view_default(h, MODELS_GENERATE);
    char path[CONFIG_PATH_MAX], err[ERR_MAX];
    float scale;
    int n = 0;
    for (size_t i = 0; dflt && i < h->view.n; i++) {
        const models_view_entry *e = &h->view.entries[i];
        if (strcmp(e->base, dflt->name) != 0)
            continue;
        const char *p = e->lora_spec, *start = p;
        for (; config_lora_next(&p, path, &scale, err) == 1; start = p) {
            if (lora_seen(h, dflt->name, i, start, path))
                continue;
            if (fn && !fn(arg, n, path))
                return n + 1;
            n++;
        }
    }
    return n;
}

/* /lora-adapters' list being made: an adapter's entry, with the adapter models applying
 * it; failed when memory ran out. */
typedef struct lora_list {
    const http *h;
    json_object *a;
    bool failed;
} lora_list;

static bool lora_list_fn(void *arg, int id, const char *path)
{
    lora_list *l = arg;
    const models_view_entry *dflt = http_view_default(l->h, MODELS_GENERATE);
    json_object *o = json_object_new_object(), *x = json_object_new_object(),
                *models = json_object_new_array();
    char p[CONFIG_PATH_MAX], err[ERR_MAX];
    float scale;
    l->failed = !o || !x || !models;
    for (size_t i = 0; !l->failed && i < l->h->view.n; i++) {
        const models_view_entry *e = &l->h->view.entries[i];
        if (strcmp(e->base, dflt->name) != 0)
            continue;
        for (const char *q = e->lora_spec; !l->failed && config_lora_next(&q, p, &scale, err) == 1;) {
            if (strcmp(p, path) != 0)
                continue;
            json_object *m = json_object_new_object();
            l->failed = !m;
            if (!m)
                break;
            json_object_object_add(m, "model", json_object_new_string(e->name));
            json_object_object_add(m, "scale", json_object_new_double(scale));
            json_object_array_add(models, m);
        }
    }
    if (l->failed) {
        json_object_put(o), json_object_put(x), json_object_put(models);
        return false;
    }
    json_object_object_add(o, "id", json_object_new_int(id));
    json_object_object_add(o, "path", json_object_new_string(path));
    json_object_object_add(o, "scale", json_object_new_double(0.0));
    json_object_object_add(x, "models", models);
    json_object_object_add(o, "llmsd", x);
    json_object_array_add(l->a, o);
    return true;
}

void llamacpp_send_lora_adapters(http *h, httpwire_conn *wc)
{
    lora_list l = {h, json_object_new_array(), false};
    if (l.a)
        llamacpp_lora_each(h, lora_list_fn, &l);
    if (!l.a || l.failed) {
        json_object_put(l.a);
        llamacpp_send_error(h, wc, R_LLAMACPP_LORA_ADAPTERS, 500, "out of memory");
        return;
    }
    http_send_json(h, wc, R_LLAMACPP_LORA_ADAPTERS, 200, l.a);
}

void llamacpp_refuse_lora_change(http *h, httpwire_conn *wc)
{
    llamacpp_send_error(h, wc, R_LLAMACPP_LORA_ADAPTERS, 501,
                        "This server does not support setting global LoRA scales: llmsd serves "
                        "each set of adapters at its scales as a model of its own (name it, or "
                        "pick it with a request's 'lora')");
}

/* llmsd has no slots to show, save or restore: a generation is one sequence of a batch
 * while it runs, and the prompt cache is kept per app, not per slot. */
void llamacpp_refuse_slots(http *h, httpwire_conn *wc, enum route r)
{
    llamacpp_send_error(h, wc, r, 501,
                        r == R_LLAMACPP_SLOTS
                            ? "This server does not support slots endpoint (llama.cpp's "
                              "--slots): llmsd's generations have no slots; /props' "
                              "total_slots counts those that run side by side"
                            : "This server does not support slots action (llama.cpp's "
                              "--slot-save-path): llmsd's prompt cache is kept per app and "
                              "resumed by itself");
}

/* ---- reading requests ---- */

/* Fields whose value off leaves the reply as llmsd makes it; any other is refused, naming
 * the field. */
enum off_when { OFF_AT_MOST, OFF_AT_LEAST };

static int refuse_samplers(json_object *body, char *msg, size_t cap)
{
    static const struct {
        const char *field;
        enum off_when when;
        double off;
        const char *why;
    } numbers[] = {
        {"tfs_z", OFF_AT_LEAST, 1, "tail-free sampling is not supported (llama.cpp has "
                                   "removed it)"},
        {"n_indent", OFF_AT_MOST, 0, "stopping at a line's indentation is not supported"},
        {"t_max_predict_ms", OFF_AT_MOST, 0, "a time limit on generation is not supported"},
    };
    static const struct {
        const char *field, *why;
    } asks[] = {
        {"post_sampling_probs", "probabilities after the samplers are not given (n_probs gives "
                                "the model's own)"},
        {"image_data", "images are not supported (no multimodal models)"},
    };
    json_object *v;
    for (size_t i = 0; i < sizeof numbers / sizeof *numbers; i++) {
        int rc = jsonfield_get(body, numbers[i].field, "", json_type_double, &v, msg, cap);
        if (rc <= 0) {
            if (rc < 0)
                return -1;
            continue;
        }
        double x = json_object_get_double(v);
        bool off = numbers[i].when == OFF_AT_MOST ? x <= numbers[i].off : x >= numbers[i].off;
        if (!off) {
            snprintf(msg, cap, "'%s': %s", numbers[i].field, numbers[i].why);
            return -1;
        }
    }
    for (size_t i = 0; i < sizeof asks / sizeof *asks; i++)
        if (json_object_object_get_ex(body, asks[i].field, &v) && !jsonfield_asks_nothing(v)) {
            snprintf(msg, cap, "'%s': %s", asks[i].field, asks[i].why);
            return -1;
        }
    return 0;
}

/* One logit_bias entry (i) of token id: a number, or false, which bans the token (llmsd's
 * ban is -100, as OpenAI's). 0, or -1 with msg. */
static int bias_entry(hreq *hr, size_t i, int32_t id, json_object *v, char *msg, size_t cap)
{
    bool ban = json_object_is_type(v, json_type_boolean) && !json_object_get_boolean(v);
    if (!ban && !json_object_is_type(v, json_type_double) &&
        !json_object_is_type(v, json_type_int)) {
        snprintf(msg, cap, "'logit_bias': token %d's bias is a number, or false to ban it", id);
        return -1;
    }
    llms__token_bias__init(&hr->bias[i]);
    hr->bias[i].token = id;
    hr->bias[i].bias = ban ? -100.0f : (float)json_object_get_double(v);
    hr->bias_ptrs[i] = &hr->bias[i];
    return 0;
}

/* llama.cpp's logit_bias into p (entries in hr): [[token id, bias or false], ...], or
 * OpenAI's {"token id": bias or false}. A text in place of a token id is refused: its
 * tokens are not looked up here. Ranges are the session's to check. 0, or -1 with msg. */
static int read_logit_bias(hreq *hr, Llms__GenerationParams *p, char *msg, size_t cap)
{
    static const char not_text[] = "'logit_bias': a text's tokens are not looked up: give "
                                   "token ids (POST /tokenize gives them)";
    json_object *o;
    if (!json_object_object_get_ex(hr->body, "logit_bias", &o) || jsonfield_asks_nothing(o))
        return 0;
    bool list = json_object_is_type(o, json_type_array);
    if (!list && !json_object_is_type(o, json_type_object)) {
        snprintf(msg, cap, "'logit_bias' is [[token id, bias], ...] or {\"token id\": bias}");
        return -1;
    }
    size_t n = list ? json_object_array_length(o) : (size_t)json_object_object_length(o);
    hr->bias = calloc(n, sizeof *hr->bias);
    hr->bias_ptrs = calloc(n, sizeof *hr->bias_ptrs);
    if (!hr->bias || !hr->bias_ptrs) {
        snprintf(msg, cap, "out of memory");
        return -1;
    }
    if (list) {
        for (size_t i = 0; i < n; i++) {
            json_object *e = json_object_array_get_idx(o, i), *id;
            if (!json_object_is_type(e, json_type_array) || json_object_array_length(e) != 2) {
                snprintf(msg, cap, "'logit_bias[%zu]' must be [token id, bias]", i);
                return -1;
            }
            id = json_object_array_get_idx(e, 0);
            if (json_object_is_type(id, json_type_string)) {
                snprintf(msg, cap, "%s", not_text);
                return -1;
            }
            int64_t t = json_object_get_int64(id);
            if (!json_object_is_type(id, json_type_int) || t < 0 || t > INT32_MAX) {
                snprintf(msg, cap, "'logit_bias[%zu]': a token id is an integer >= 0", i);
                return -1;
            }
            if (bias_entry(hr, i, (int32_t)t, json_object_array_get_idx(e, 1), msg, cap))
                return -1;
        }
    } else {
        size_t i = 0;
        json_object_object_foreach(o, key, value)
        {
            int32_t id;
            if (!openai_token_id(key, &id)) {
                snprintf(msg, cap, "%s (\"%.32s\" is no token id)", not_text, key);
                return -1;
            }
            if (bias_entry(hr, i++, id, value, msg, cap))
                return -1;
        }
    }
    p->n_logit_bias = n;
    p->logit_bias = hr->bias_ptrs;
    return 0;
}

/* The sampling fields llama.cpp and llmsd share into p (stops into lc). 0, or -1 with
 * msg. */
static int read_params(hreq *hr, struct llamacpp_req *lc, char *msg, size_t cap)
{
    Llms__GenerationParams *p = &lc->gp;
    json_object *body = hr->body, *v;
    int rc;
    if (jsonfield_sampling_floats(body, "", p, msg, cap) < 0)
        return -1;
    if ((rc = jsonfield_get(body, "top_k", "", json_type_int, &v, msg, cap)) < 0)
        return -1;
    /* llama.cpp's top_k <= 0 is off, the native 0 */
    if (rc) {
        int64_t k = json_object_get_int64(v);
        p->has_top_k = 1, p->top_k = k < 0 ? 0 : k > INT32_MAX ? INT32_MAX : (int32_t)k;
    }
    if ((rc = jsonfield_get(body, "ignore_eos", "", json_type_boolean, &v, msg, cap)) < 0)
        return -1;
    if (rc)
        p->has_ignore_eos = 1, p->ignore_eos = json_object_get_boolean(v);
    if ((rc = jsonfield_get(body, "repeat_last_n", "", json_type_int, &v, msg, cap)) < 0)
        return -1;
    /* llama.cpp's -1 is the window, the native -1 the whole history: the same */
    if (rc && (json_object_get_int64(v) < -1 || json_object_get_int64(v) > INT32_MAX)) {
        snprintf(msg, cap, "'repeat_last_n' must be -1 (the window) or more");
        return -1;
    }
    if (rc)
        p->has_repeat_last_n = 1, p->repeat_last_n = (int32_t)json_object_get_int64(v);
    if ((rc = jsonfield_get(body, "seed", "", json_type_int, &v, msg, cap)) < 0)
        return -1;
    /* -1 and llama.cpp's default 4294967295 pick one at random, as leaving it out */
    if (rc && json_object_get_int64(v) >= 0 && json_object_get_int64(v) != RANDOM_SEED)
        p->has_seed = 1, p->seed = (uint64_t)json_object_get_int64(v);
    /* llama.cpp takes OpenAI's max_tokens when n_predict is not given */
    const char *key = json_object_object_get_ex(body, "n_predict", &v) &&
                              !json_object_is_type(v, json_type_null)
                          ? "n_predict" : "max_tokens";
    if ((rc = jsonfield_get(body, key, "", json_type_int, &v, msg, cap)) < 0)
        return -1;
    lc->n_predict = rc ? json_object_get_int64(v) : hr->h->cfg->max_tokens;
    if (lc->n_predict < -1) {
        snprintf(msg, cap, "'%s' must be a count, -1 (until the end of text or a full window) "
                           "or 0 (the prompt alone)", key);
        return -1;
    }
    /* -1 ends as the window fills: a Complete's window does not slide. 0 evaluates the
     * prompt (into the prompt cache, which is what clients send it for) and keeps none of
     * the one token a generation makes at least. */
    lc->discard = lc->n_predict == 0;
    p->has_max_tokens = 1;
    if (lc->n_predict < 0)
        p->max_tokens = hr->h->cfg->n_ctx;
    else
        p->max_tokens = lc->discard                ? 1
                        : lc->n_predict > INT32_MAX ? INT32_MAX
                                                    : (int32_t)lc->n_predict;
    /* one place of the matcher is a chat template's end text, which a raw prompt has not:
     * all the others are the request's */
    return jsonfield_stops(body, "stop", "", p, STOP_MAX - 1, msg, cap);
}

/* n_probs (else OpenAI's logprobs count, as llama.cpp takes it) and return_tokens into
 * lc: both come from the native logprobs, which carry the reply's token ids. 0, or -1
 * with msg. */
static int read_probs(hreq *hr, struct llamacpp_req *lc, char *msg, size_t cap)
{
    json_object *v;
    const char *key = json_object_object_get_ex(hr->body, "n_probs", &v) &&
                              !json_object_is_type(v, json_type_null)
                          ? "n_probs" : "logprobs";
    int rc = jsonfield_get(hr->body, key, "", json_type_int, &v, msg, cap);
    if (rc < 0)
        return -1;
    int64_t n = rc ? json_object_get_int64(v) : 0;
    if (n < 0 || n > LOGPROB_TOP_MAX) {
        snprintf(msg, cap, "'%s' must be in [0, %d]", key, LOGPROB_TOP_MAX);
        return -1;
    }
    lc->n_probs = (int)n;
    if ((rc = jsonfield_get(hr->body, "return_tokens", "", json_type_boolean, &v, msg, cap)) < 0)
        return -1;
    lc->return_tokens = rc && json_object_get_boolean(v);
    if (lc->n_probs > 0 || lc->return_tokens)
        lc->gp.has_logprobs = 1, lc->gp.logprobs = lc->n_probs;
    return 0;
}

/* Fields of llama.cpp's own machinery, read past: their type is still checked. 0, or -1
 * with msg. */
static int check_read_past(json_object *body, char *msg, size_t cap)
{
    static const struct {
        const char *field;
        json_type type;
    } fields[] = {
        {"cache_prompt", json_type_boolean}, {"id_slot", json_type_int},
        {"n_keep", json_type_int}, {"n_discard", json_type_int},
        {"timings_per_token", json_type_boolean},
    };
    json_object *v, *names;
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
        if (jsonfield_get(body, fields[i].field, "", fields[i].type, &v, msg, cap) < 0)
            return -1;
    int rc = jsonfield_get(body, "response_fields", "", json_type_array, &names, msg, cap);
    if (rc < 0)
        return -1;
    for (size_t i = 0; rc && i < json_object_array_length(names); i++)
        if (!json_object_is_type(json_object_array_get_idx(names, i), json_type_string)) {
            snprintf(msg, cap, "'response_fields' must be an array of strings");
            return -1;
        }
    return 0;
}

/* A prompt's token id at prompt[i] into *id: 0, or -1 with msg. */
static int prompt_id(json_object *e, size_t i, int32_t *id, char *msg, size_t cap)
{
    int64_t t = json_object_get_int64(e);
    if (t < 0 || t > INT32_MAX) {
        snprintf(msg, cap, "'prompt[%zu]': a token id is an integer >= 0", i);
        return -1;
    }
    *id = (int32_t)t;
    return 0;
}

/*
 * llama.cpp's prompt into cr: a string is the Complete's prompt; token ids, or strings
 * and ids mixed, are its prompt_parts (each string a part, each run of ids one), whose
 * arrays (*parts, *ptrs, *ids, to free once submitted) are made here. An array of one
 * prompt is that prompt; several, which llama.cpp answers with several completions, are
 * refused. 0, or -1 with msg.
 */
static int read_prompt(hreq *hr, Llms__CompleteRequest *cr, Llms__PromptPart **parts,
                       Llms__PromptPart ***ptrs, int32_t **ids, char *msg, size_t cap)
{
    static const char shape[] = "'prompt' must be a string, an array of token ids, or an "
                                "array of strings and token ids";
    json_object *v;
    if (!json_object_object_get_ex(hr->body, "prompt", &v) ||
        json_object_is_type(v, json_type_null)) {
        snprintf(msg, cap, "'prompt' is required");
        return -1;
    }
    if (json_object_is_type(v, json_type_array) && json_object_array_length(v) == 1 &&
        (json_object_is_type(json_object_array_get_idx(v, 0), json_type_string) ||
         json_object_is_type(json_object_array_get_idx(v, 0), json_type_array)))
        v = json_object_array_get_idx(v, 0);
    if (json_object_is_type(v, json_type_string)) {
        cr->prompt = (char *)json_object_get_string(v);
        return 0;
    }
    if (!json_object_is_type(v, json_type_array)) {
        snprintf(msg, cap, "%s", shape);
        return -1;
    }
    size_t n = json_object_array_length(v), n_parts = 0, n_strings = 0;
    if (n == 0) {
        snprintf(msg, cap, "'prompt' is empty");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        json_object *e = json_object_array_get_idx(v, i);
        bool text = json_object_is_type(e, json_type_string);
        if (json_object_is_type(e, json_type_array)) {
            snprintf(msg, cap, "'prompt': several prompts in one request are not supported: "
                               "send one per request");
            return -1;
        }
        if (!text && !json_object_is_type(e, json_type_int)) {
            snprintf(msg, cap, "%s", shape);
            return -1;
        }
        if (text && json_object_get_string_len(e) == 0) {
            snprintf(msg, cap, "'prompt[%zu]' is an empty string", i);
            return -1;
        }
        n_strings += text;
        /* a part begins at each string and at each run of ids */
        n_parts += text || i == 0 || json_object_is_type(json_object_array_get_idx(v, i - 1),
                                                         json_type_string);
    }
    if (n_strings == n) {
        snprintf(msg, cap, "'prompt': several prompts in one request are not supported: send "
                           "one per request");
        return -1;
    }
    *parts = calloc(n_parts, sizeof **parts);
    *ptrs = calloc(n_parts, sizeof **ptrs);
    *ids = malloc((n - n_strings) * sizeof **ids);
    if (!*parts || !*ptrs || !*ids) {
        snprintf(msg, cap, "out of memory");
        return -1;
    }
    Llms__PromptPart *part = NULL;
    size_t k = 0, used = 0;
    for (size_t i = 0; i < n; i++) {
        json_object *e = json_object_array_get_idx(v, i);
        bool text = json_object_is_type(e, json_type_string);
        if (text || !part || part->text) {
            part = &(*parts)[k];
            llms__prompt_part__init(part);
            (*ptrs)[k++] = part;
            if (!text)
                part->tokens = *ids + used;
        }
        if (text)
            part->text = (char *)json_object_get_string(e);
        else if (prompt_id(e, i, &(*ids)[used++], msg, cap))
            return -1;
        else
            part->n_tokens++;
    }
    cr->prompt = "";
    cr->prompt_parts = *ptrs;
    cr->n_prompt_parts = n_parts;
    return 0;
}

/* hr's llama.cpp state (hr->lc), made empty. 0, or -1 after answering (out of memory). */
static int new_req(hreq *hr)
{
    struct llamacpp_req *lc = hr->lc = calloc(1, sizeof *hr->lc);
    if (!lc) {
        llamacpp_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return -1;
    }
    llms__generation_params__init(&lc->gp);
    lc->gp.stop = lc->stops;
    return 0;
}

/* What /completion and /infill read alike, all but the prompt: stream, the generation
 * fields into hr->lc, and cr's params and model. 0, or -1 with msg. */
static int read_generation(hreq *hr, Llms__CompleteRequest *cr, char *msg, size_t cap)
{
    json_object *v;
    struct llamacpp_req *lc = hr->lc;
    int rc = jsonfield_get(hr->body, "stream", "", json_type_boolean, &v, msg, cap);
    if (rc < 0)
        return -1;
    hr->stream = rc && json_object_get_boolean(v);
    if (read_params(hr, lc, msg, cap) ||
        llamaparams_read(hr->body, &lc->gp, &lc->lists, msg, cap) ||
        read_logit_bias(hr, &lc->gp, msg, cap) || read_probs(hr, lc, msg, cap) ||
        openai_read_format(hr->body, &lc->gp, msg, cap) ||
        refuse_samplers(hr->body, msg, cap) || check_read_past(hr->body, msg, cap))
        return -1;
    cr->params = &lc->gp;
    cr->model = (char *)hr->model_named;
    return 0;
}

/* Submits cr, read whole, as hr's native Complete (packed into a request of its own: what
 * cr points to is not needed after). */
static void submit_complete(hreq *hr, Llms__Request *r, Llms__CompleteRequest *cr)
{
    if (hr->stream && !(hr->sse = evbuffer_new())) {
        llamacpp_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    r->body_case = LLMS__REQUEST__BODY_COMPLETE;
    r->complete = cr;
    http_submit(hr, r);
}

void llamacpp_start_completion(hreq *hr, Llms__Request *r, char *msg, size_t cap)
{
    Llms__CompleteRequest cr = LLMS__COMPLETE_REQUEST__INIT;
    Llms__PromptPart *parts = NULL, **ptrs = NULL;
    int32_t *ids = NULL;
    if (new_req(hr))
        return;
    if (read_prompt(hr, &cr, &parts, &ptrs, &ids, msg, cap) || read_generation(hr, &cr, msg, cap)) {
        llamacpp_finish_error(hr, LLMS__ERROR_CODE__INVALID_ARGUMENT, msg);
    } else {
        if (!cr.n_prompt_parts)
            hr->lc->prompt = cr.prompt;
        submit_complete(hr, r, &cr);
    }
    free(parts);
    free(ptrs);
    free(ids);
}

/* llama.cpp's /infill fields into p (the chunks in *extra, to free): input_prefix and
 * input_suffix (strings, required), prompt (a string, optional), input_extra (an array of
 * {"filename"?, "text"}, optional), in llama.cpp's order and words where it has them;
 * their texts together at most max_text_bytes, as a prompt's text, since the loop
 * tokenizes them. 0, or -1 with msg. */
static int read_infill(hreq *hr, infill_parts *p, infill_chunk **extra, char *msg, size_t cap)
{
    static const char chunk_shape[] = "\"input_extra\" must be an array of {\"filename\": "
                                      "string, \"text\": string}";
    json_object *body = hr->body, *v, *arr;
    size_t bytes = 0;
    p->prompt = "";
    if (json_object_object_get_ex(body, "prompt", &v) && !json_object_is_type(v, json_type_null)) {
        if (!json_object_is_type(v, json_type_string)) {
            snprintf(msg, cap, "\"prompt\" must be a string");
            return -1;
        }
        p->prompt = json_object_get_string(v);
    }
    const char *const names[] = {"input_prefix", "input_suffix"};
    const char **texts[] = {&p->prefix, &p->suffix};
    for (size_t i = 0; i < 2; i++) {
        if (!json_object_object_get_ex(body, names[i], &v)) {
            snprintf(msg, cap, "\"%s\" is required", names[i]);
            return -1;
        }
        /* llama.cpp takes token ids mixed with strings here too; editor plugins send
         * text, and only text is taken */
        if (!json_object_is_type(v, json_type_string)) {
            snprintf(msg, cap, "\"%s\" must be a string", names[i]);
            return -1;
        }
        *texts[i] = json_object_get_string(v);
    }
    size_t n = 0;
    if (json_object_object_get_ex(body, "input_extra", &arr) &&
        !json_object_is_type(arr, json_type_null)) {
        if (!json_object_is_type(arr, json_type_array)) {
            snprintf(msg, cap, "%s", chunk_shape);
            return -1;
        }
        n = json_object_array_length(arr);
    }
    if (!(*extra = calloc(n ? n : 1, sizeof **extra))) {
        snprintf(msg, cap, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        json_object *c = json_object_array_get_idx(arr, i), *text, *name;
        if (!json_object_is_type(c, json_type_object) ||
            !json_object_object_get_ex(c, "text", &text) ||
            !json_object_is_type(text, json_type_string)) {
            snprintf(msg, cap, "extra_context chunk must contain a \"text\" field with a string "
                               "value (input_extra[%zu])", i);
            return -1;
        }
        bool named = json_object_object_get_ex(c, "filename", &name);
        if (named && !json_object_is_type(name, json_type_string)) {
            snprintf(msg, cap, "extra_context chunk's \"filename\" field must be a string "
                               "(input_extra[%zu])", i);
            return -1;
        }
        (*extra)[i].text = json_object_get_string(text);
        (*extra)[i].filename = named ? json_object_get_string(name) : NULL;
        bytes += strlen((*extra)[i].text) + (named ? strlen((*extra)[i].filename) : 0);
    }
    p->extra = *extra;
    p->n_extra = n;
    bytes += strlen(p->prefix) + strlen(p->suffix) + strlen(p->prompt);
    if (bytes > (size_t)hr->h->cfg->max_text_bytes) {
        snprintf(msg, cap, "the infill's texts (input_prefix, input_suffix, prompt and "
                           "input_extra) are %zu bytes, the limit is %d (max_text_bytes)",
                 bytes, hr->h->cfg->max_text_bytes);
        return -1;
    }
    return 0;
}

/* The text of n tokens (the tokenizer's own) as llama.cpp's server gives a prompt back
 * (special tokens as written), whole UTF-8: a cut prefix may begin inside a character.
 * Fresh string, or NULL out of memory. */
static char *prompt_text(const tokenizer *tok, const int32_t *ids, int n)
{
    int need = tok_decode(tok, ids, n, false, true, NULL, 0);
    char *raw = need >= 0 ? malloc((size_t)need + 1) : NULL;
    char *text = raw ? malloc(UTF8_OUT_CAP(need) + 1) : NULL;
    if (text) {
        tok_decode(tok, ids, n, false, true, raw, (size_t)need + 1);
        utf8_stream u = {0};
        size_t len = utf8_stream_feed(&u, raw, (size_t)need, text);
        len += utf8_stream_flush(&u, text + len);
        text[len] = '\0';
    }
    free(raw);
    return text;
}

void llamacpp_start_infill(hreq *hr, Llms__Request *r, char *msg, size_t cap)
{
    const tokenizer *tok = hr->h->senv.tok;
    Llms__CompleteRequest cr = LLMS__COMPLETE_REQUEST__INIT;
    Llms__PromptPart part = LLMS__PROMPT_PART__INIT, *ptr = &part;
    infill_parts p = {0};
    infill_chunk *extra = NULL;
    int32_t *ids = NULL;
    int n = 0;
    char err[ERR_MAX];
    /* the model first: llama.cpp's server refuses an infill on it before reading the body */
    if (!infill_supported(tok, msg, cap)) {
        llamacpp_finish_error(hr, LLMS__ERROR_CODE__UNIMPLEMENTED, msg);
        return;
    }
    if (new_req(hr))
        return;
    if (read_infill(hr, &p, &extra, msg, cap) || read_generation(hr, &cr, msg, cap)) {
        llamacpp_finish_error(hr, LLMS__ERROR_CODE__INVALID_ARGUMENT, msg);
    } else if (infill_tokens(tok, &p, hr->h->cfg->n_ctx, hr->lc->n_predict, &ids, &n, err)) {
        llamacpp_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, err);
    } else if (!(hr->lc->prompt = hr->lc->infill_prompt = prompt_text(tok, ids, n))) {
        llamacpp_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
    } else {
        part.tokens = ids;
        part.n_tokens = (size_t)n;
        cr.prompt = "";
        cr.prompt_parts = &ptr;
        cr.n_prompt_parts = 1;
        submit_complete(hr, r, &cr);
    }
    free(ids);
    free(extra);
}

void llamacpp_req_free(struct llamacpp_req *lc)
{
    if (!lc)
        return;
    free(lc->infill_prompt);
    free(lc);
}

/* The chat route's own reading of messages, tools and chat_template_kwargs and its own
 * rendering, so that the prompt is the very text it would evaluate; nothing else of the
 * body shapes a prompt but llmsd's context, whose turn is rendered against its history,
 * which is the worker's. */
void llamacpp_apply_template(hreq *hr, char *msg, size_t cap)
{
    json_object *msgs, *ext, *context;
    char *prompt = NULL;
    int rc = jsonfield_get(hr->body, "llmsd", "", json_type_object, &ext, msg, cap);
    if (rc == 1)
        rc = jsonfield_get(ext, "context", "", json_type_string, &context, msg, cap);
    if (rc == 1) {
        snprintf(msg, cap, "'llmsd.context': a context's turn is rendered against its "
                           "history, not here");
        rc = -1;
    }
    if (rc < 0 || openai_read_thinking(hr, msg, cap) < 0 ||
        toolcall_read(hr->body, hr->family, &hr->tools, msg, cap) < 0 ||
        openai_chat_messages(hr->body, &msgs, msg, cap) ||
        !(prompt = openai_render_chat(hr, msgs, msg, cap))) {
        llamacpp_finish_error(hr, LLMS__ERROR_CODE__INVALID_ARGUMENT, msg);
        return;
    }
    http_req_finish(hr);
    json_object *o = json_object_new_object(), *p = json_object_new_string(prompt);
    free(prompt);
    if (!o || !p) {
        json_object_put(o);
        json_object_put(p);
        llamacpp_send_error(hr->h, hr->wc, hr->route, 500, "out of memory");
        return;
    }
    json_object_object_add(o, "prompt", p);
    http_send_json(hr->h, hr->wc, hr->route, 200, o);
}

/* llama.cpp's /embedding: its "content" (or OpenAI's "input", which its server reads
 * first), a text or texts, embedded as /v1/embeddings embeds them. */
void llamacpp_start_embedding(hreq *hr, Llms__Request *r, char *msg, size_t cap)
{
    json_object *in, *v;
    int rc = jsonfield_get(hr->body, "encoding_format", "", json_type_string, &v, msg, cap);
    if (rc < 0)
        goto bad;
    /* checked as llama.cpp's server checks it, which then answers this route with numbers
     * whichever was asked: its base64 is for /v1/embeddings */
    if (rc && strcmp(json_object_get_string(v), "float") &&
        strcmp(json_object_get_string(v), "base64")) {
        snprintf(msg, cap, "'encoding_format' must be float or base64");
        goto bad;
    }
    const char *field = json_object_object_get_ex(hr->body, "input", &in) ? "input" : "content";
    if (!json_object_object_get_ex(hr->body, field, &in)) {
        snprintf(msg, cap, "'content' (or 'input') is required");
        goto bad;
    }
    openai_submit_embed(hr, r, in, field, msg, cap);
    return;
bad:
    llamacpp_finish_error(hr, LLMS__ERROR_CODE__INVALID_ARGUMENT, msg);
}

/* ---- answers ---- */

/* A log-probability: llama.cpp writes the lowest float for a token the model gave no
 * probability, as JSON has no infinity. */
static json_object *logprob_number(float lp)
{
    return json_object_new_double(isfinite(lp) ? (double)lp : -3.40282347e38);
}

/* One token of completion_probabilities: {id, token, bytes, logprob} and, for a chosen
 * token (not an alternative), top_logprobs. */
static json_object *prob_entry(const Llms__TokenLogprob *t, bool chosen)
{
    json_object *e = json_object_new_object();
    if (!e)
        return NULL;
    json_object_object_add(e, "id", json_object_new_int(t->token));
    json_object_object_add(e, "token", openai_piece_text(&t->piece, false));
    json_object_object_add(e, "bytes", openai_piece_bytes(&t->piece));
    json_object_object_add(e, "logprob", logprob_number(t->logprob));
    if (chosen) {
        json_object *top = json_object_new_array();
        for (size_t k = 0; top && k < t->n_top; k++)
            json_object_array_add(top, prob_entry(t->top[k], false));
        json_object_object_add(e, "top_logprobs", top);
    }
    return e;
}

/* completion_probabilities of n tokens into o (nothing when the request asked for
 * none). */
static void add_probs(const hreq *hr, json_object *o, Llms__TokenLogprob *const *lps, size_t n)
{
    if (hr->lc->n_probs == 0)
        return;
    json_object *a = json_object_new_array();
    for (size_t i = 0; a && i < n; i++)
        json_object_array_add(a, prob_entry(lps[i], true));
    json_object_object_add(o, "completion_probabilities", a);
}

void llamacpp_stream_start(hreq *hr)
{
    if (hr->started)
        return;
    httpwire_add_header(hr->wc, "Content-Type", "text/event-stream");
    httpwire_add_header(hr->wc, "Cache-Control", "no-cache");
    httpwire_stream_start(hr->wc, 200);
    http_count_status(hr->h, hr->route, 200);
    hr->started = true;
}

/* Sends o (taken) as one event of hr's stream. */
static void send_event(hreq *hr, json_object *o)
{
    if (!o)
        return;
    evbuffer_add_printf(hr->sse, "data: %s\n\n", http_json_text(o));
    json_object_put(o);
    httpwire_stream_chunk(hr->wc, hr->sse);
}

void llamacpp_stream_chunk(hreq *hr, const Llms__CallChunk *ch)
{
    struct llamacpp_req *lc = hr->lc;
    gen_choice *c = &hr->choices[0];
    /* n_predict 0 keeps nothing of the token made */
    if (lc->discard)
        return;
    json_object *o = json_object_new_object(), *toks = json_object_new_array();
    if (!o || !toks) {
        json_object_put(o);
        json_object_put(toks);
        return;
    }
    for (size_t i = 0; i < ch->n_tokens; i++)
        json_object_array_add(toks, json_object_new_int(ch->tokens[i]));
    lc->tokens_sent += ch->n_tokens;
    json_object_object_add(o, "index", json_object_new_int(0));
    json_object_object_add(o, "content", json_object_new_string(ch->text));
    json_object_object_add(o, "tokens", toks);
    json_object_object_add(o, "stop", json_object_new_boolean(0));
    json_object_object_add(o, "id_slot", json_object_new_int(0));
    json_object_object_add(o, "tokens_predicted", json_object_new_int64((int64_t)lc->tokens_sent));
    add_probs(hr, o, ch->logprobs, ch->n_logprobs);
    c->sent += strlen(ch->text);
    c->lp_seen += ch->n_logprobs;
    send_event(hr, o);
}

/* llama.cpp's stop_type: why the reply ended, "none" for what it has no word for (the
 * daemon shutting down; a slow reader's reply cancelled). */
static const char *stop_type(Llms__StopReason r)
{
    switch (r) {
    case LLMS__STOP_REASON__STOP_EOS: return "eos";
    case LLMS__STOP_REASON__STOP_STRING: return "word";
    case LLMS__STOP_REASON__STOP_MAX_TOKENS:
    case LLMS__STOP_REASON__STOP_CONTEXT_FULL: return "limit";
    default: return "none";
    }
}

/* llama.cpp's timings: the prompt's tokens evaluated (those resumed from the prompt cache
 * were not) and the tokens generated, their times and rates. */
static json_object *timings_obj(uint32_t prompt_n, double prompt_ms, uint32_t predicted_n,
                                double predicted_ms)
{
    json_object *t = json_object_new_object();
    if (!t)
        return NULL;
    json_object_object_add(t, "prompt_n", json_object_new_int64(prompt_n));
    json_object_object_add(t, "prompt_ms", json_object_new_double(prompt_ms));
    json_object_object_add(t, "prompt_per_token_ms",
                           json_object_new_double(prompt_n ? prompt_ms / prompt_n : 0));
    json_object_object_add(t, "prompt_per_second",
                           json_object_new_double(prompt_ms > 0 ? 1e3 * prompt_n / prompt_ms : 0));
    json_object_object_add(t, "predicted_n", json_object_new_int64(predicted_n));
    json_object_object_add(t, "predicted_ms", json_object_new_double(predicted_ms));
    json_object_object_add(t, "predicted_per_token_ms",
                           json_object_new_double(predicted_n ? predicted_ms / predicted_n : 0));
    json_object_object_add(t, "predicted_per_second",
                           json_object_new_double(predicted_ms > 0 ? 1e3 * predicted_n /
                                                                         predicted_ms
                                                                   : 0));
    return t;
}

/* The fields of o that response_fields names (a slash reaches into an object, the value
 * then named by the whole path), as llama.cpp picks them; o itself when it names none.
 * Takes o. */
static json_object *pick_fields(json_object *body, json_object *o)
{
    json_object *names;
    if (!o || !json_object_object_get_ex(body, "response_fields", &names) ||
        !json_object_is_type(names, json_type_array) || json_object_array_length(names) == 0)
        return o;
    json_object *picked = json_object_new_object();
    for (size_t i = 0; picked && i < json_object_array_length(names); i++) {
        const char *path = json_object_get_string(json_object_array_get_idx(names, i));
        json_object *at = o;
        for (const char *k = path; at && k;) {
            const char *slash = strchr(k, '/');
            size_t len = slash ? (size_t)(slash - k) : strlen(k);
            char key[256];
            snprintf(key, sizeof key, "%.*s", (int)(len < sizeof key ? len : sizeof key - 1), k);
            if (!json_object_is_type(at, json_type_object) ||
                !json_object_object_get_ex(at, key, &at))
                at = NULL;
            k = slash ? slash + 1 : NULL;
        }
        if (at)
            json_object_object_add(picked, path, json_object_get(at));
    }
    json_object_put(o);
    return picked;
}

void llamacpp_on_result(hreq *hr, const Llms__CallResult *res)
{
    http *h = hr->h;
    struct llamacpp_req *lc = hr->lc;
    gen_choice *c = &hr->choices[0];
    uint32_t cached = res->has_cached_tokens ? res->cached_tokens : 0;
    uint32_t generated = lc->discard ? 0 : res->generated_tokens;
    const char *text = lc->discard ? "" : res->text;
    bool full = res->stop_reason == LLMS__STOP_REASON__STOP_CONTEXT_FULL;
    const char *word = res->stop_reason == LLMS__STOP_REASON__STOP_STRING && res->stop_string
                           ? res->stop_string : "";
    h->prompt_tokens += res->prompt_tokens;
    h->cached_tokens += cached;
    h->completion_tokens += res->generated_tokens;
    http_req_finish(hr);
    /* streamed, the text went in the events before: what a slow reader's dropped events
     * held comes in the last */
    size_t len = strlen(text), from = 0;
    if (hr->stream)
        from = c->sent < len ? c->sent : len;
    json_object *o = json_object_new_object(), *toks = json_object_new_array();
    if (!o || !toks) {
        json_object_put(o);
        json_object_put(toks);
        llamacpp_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    /* streamed, the ids went in the events before */
    for (size_t i = 0; lc->return_tokens && !hr->stream && !lc->discard && i < res->n_logprobs;
         i++)
        json_object_array_add(toks, json_object_new_int(res->logprobs[i]->token));
    json_object_object_add(o, "index", json_object_new_int(0));
    json_object_object_add(o, "content", json_object_new_string(text + from));
    json_object_object_add(o, "tokens", toks);
    json_object_object_add(o, "id_slot", json_object_new_int(0));
    json_object_object_add(o, "stop", json_object_new_boolean(1));
    json_object_object_add(o, "model", json_object_new_string(hr->model));
    json_object_object_add(o, "tokens_predicted", json_object_new_int64(generated));
    json_object_object_add(o, "tokens_evaluated", json_object_new_int64(res->prompt_tokens));
    json_object_object_add(o, "generation_settings",
                           settings_json(h->cfg, &lc->gp, lc->n_predict, lc->n_probs,
                                         hr->stream));
    if (lc->prompt)
        json_object_object_add(o, "prompt", json_object_new_string(lc->prompt));
    json_object_object_add(o, "has_new_line", json_object_new_boolean(strchr(text, '\n') != NULL));
    json_object_object_add(o, "truncated", json_object_new_boolean(full));
    /* n_predict 0 is reached before any token is kept */
    const char *why = lc->discard ? "limit" : stop_type(res->stop_reason);
    json_object_object_add(o, "stop_type", json_object_new_string(why));
    json_object_object_add(o, "stopping_word", json_object_new_string(lc->discard ? "" : word));
    json_object_object_add(o, "tokens_cached", json_object_new_int64(cached));
    json_object_object_add(o, "timings",
                           timings_obj(res->prompt_tokens - cached, res->prefill_ms, generated,
                                       lc->discard ? 0 : res->decode_ms));
    size_t lp_from = hr->stream ? c->lp_seen : 0;
    if (!lc->discard && lp_from < res->n_logprobs)
        add_probs(hr, o, res->logprobs + lp_from, res->n_logprobs - lp_from);
    if (!hr->stream) {
        http_send_json(h, hr->wc, hr->route, 200, pick_fields(hr->body, o));
        return;
    }
    llamacpp_stream_start(hr);
    send_event(hr, o);
    httpwire_stream_end(hr->wc);
}

/* llama.cpp's shape of a pooled model's embeddings: [{"index", "embedding": [vector]}],
 * each text's one vector pooled and L2-normalised (llmsd always pools, so never the
 * per-token vectors llama.cpp's server gives with --pooling none). */
void llamacpp_on_embedding(hreq *hr, const Llms__EmbedResponse *e)
{
    http *h = hr->h;
    http_req_finish(hr);
    for (size_t i = 0; i < e->n_n_tokens; i++)
        h->embed_tokens += e->n_tokens[i];
    json_object *a = json_object_new_array_ext((int)e->n_vectors);
    bool ok = a != NULL;
    for (size_t i = 0; ok && i < e->n_vectors; i++) {
        json_object *item = json_object_new_object(), *one = json_object_new_array_ext(1),
                    *v = http_vector_json(e->vectors[i]);
        ok = item && one && v;
        if (!ok) {
            json_object_put(item);
            json_object_put(one);
            json_object_put(v);
            break;
        }
        json_object_array_add(one, v);
        json_object_object_add(item, "index", json_object_new_int((int)i));
        json_object_object_add(item, "embedding", one);
        json_object_array_add(a, item);
    }
    if (!ok) {
        json_object_put(a);
        llamacpp_send_error(h, hr->wc, hr->route, 500, "out of memory");
        return;
    }
    http_send_json(h, hr->wc, hr->route, 200, a);
}
