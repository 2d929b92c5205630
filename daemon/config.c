/*
 * config.c — parsing llmsd's settings. A table maps each key to its field, type and
 * range, so the file parser, the flags and --help share one list.
 */
#include "daemon/config.h"
#include "daemon/reqlog.h"

#include <ctype.h>
#include <stdbool.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* KEY_OPTIONAL: a string setting that may be off, written "none". */
enum key_type { KEY_STRING, KEY_OPTIONAL, KEY_INT, KEY_FLOAT, KEY_MODE, KEY_CHOICE };

typedef struct key_def {
    const char *name;
    enum key_type type;
    size_t offset;
    size_t size;       /* KEY_STRING: capacity of the field */
    double min, max;   /* numeric range, inclusive */
    const char *help;
    const char *choices; /* KEY_CHOICE: the allowed values, '|'-separated */
} key_def;

#define STR(f, h) {#f, KEY_STRING, offsetof(config, f), sizeof((config *)0)->f, 0, 0, h, NULL}
#define OPT(f, h) {#f, KEY_OPTIONAL, offsetof(config, f), sizeof((config *)0)->f, 0, 0, h, NULL}
#define INT(f, lo, hi, h) {#f, KEY_INT, offsetof(config, f), 0, lo, hi, h, NULL}
#define CHOICE(f, c, h) {#f, KEY_CHOICE, offsetof(config, f), sizeof((config *)0)->f, 0, 0, h, c}
#define FLT(f, lo, hi, h) {#f, KEY_FLOAT, offsetof(config, f), 0, lo, hi, h, NULL}

static const key_def keys[] = {
    STR(model, "the generate model's GGUF file (required unless a model.NAME line has the "
               "generate role); its name in the registry is the file name without .gguf"),
    CHOICE(model_load, "map|copy",
           "how the weights come into memory: map (shared with the page cache, reclaimable "
           "under pressure) or copy (private memory on huge pages: fewer TLB misses when "
           "decode streams them, never reclaimed) (default map)"),
    STR(socket, "Unix socket path (default /run/llmsd/llmsd.sock)"),
    STR(state_dir, "state directory holding the catalog (default /var/lib/llmsd)"),
    INT(threads, 0, 1024, "engine threads, 0 = online cores (default 0)"),
    INT(n_ctx, 0, 1 << 24, "tokens per context window, 0 = min(model, 4096) (default 0)"),
    INT(max_contexts_per_app, 1, INT_MAX, "contexts an app may keep (default 64)"),
    INT(max_tokens_per_context, 0, 1 << 24, "tokens per context, 0 = n_ctx (default 0)"),
    CHOICE(overflow, "window|refuse",
           "what a context does when a call fills its window (max_tokens_per_context), "
           "unless created with its own: window (keep the first tokens and the most recent, "
           "drop the middle, go on) or refuse (stop the reply; later calls fail) "
           "(default window)"),
    INT(window_sink, 4, 1 << 24, "tokens a sliding window keeps at the start, at least "
                                 "(rounded up to 16-token chunks; a system prompt is kept "
                                 "whole up to half the window) (default 4)"),
    INT(max_queued_per_app, 1, INT_MAX, "requests of every kind that wait for or use the "
                                        "engine (Call, Complete, Embed, Rerank, KbAdd, "
                                        "KbDrop) an app may have queued or running "
                                        "(default 16)"),
    INT(step_tokens, 16, 1024, "rows of prefill, embedding and reranking work a scheduler "
                               "step adds to the decode rows of every running generation "
                               "(default 64)"),
    CHOICE(sched, "batched|serial",
           "batched: one forward per step for every running sequence, long work in slices; "
           "serial: each sequence its own forward, long work to completion (the old "
           "behaviour, for comparison) (default batched)"),
    {"max_frame_bytes", KEY_INT, offsetof(config, max_frame_bytes), 0, 1024, (double)UINT32_MAX,
     "largest frame accepted or sent (default 16777216)", NULL},
    INT(kv_budget_mb, 0, INT_MAX, "resident KV cap in MiB, 0 = none; idle contexts' chunks "
                                  "over it are dropped, LCTRU order (default 1024)"),
    INT(prefill_budget_mb, 0, INT_MAX, "working memory of a prefill step in MiB, 0 = none: "
                                       "the engine's step rows and attention score blocks "
                                       "are planned to fit it for a prompt of n_ctx tokens, "
                                       "or llmsd does not start (default 0)"),
    INT(resident_small_mb, -1, INT_MAX, "weights (model_load = map) stay resident up to this "
                                        "many MiB, smallest matrices first; the others stream "
                                        "per layer during prefill, -1 = all resident "
                                        "(default -1)"),
    INT(kv_wait_ms, 0, INT_MAX, "how long a Call or Complete waits for running calls to "
                                "leave room under kv_budget_mb before RESOURCE_EXHAUSTED "
                                "(default 30000)"),
    CHOICE(kv_compress, "tolerance|int8|none",
           "KV chunk compression after a call: tolerance (K and V code widths of 2-8 bits "
           "per chunk by attention density and value spread), int8, or none (f16, lossless) "
           "(default tolerance)"),
    FLT(kv_compress_ratio, 0.25, 1, "tolerance mode: bytes of the compressed chunks over "
                                    "their bytes as int8, scales included; 0.53-0.6 is "
                                    "uniform int4's, by head size (default 0.6)"),
    INT(kv_calib_inline_ms, 1, INT_MAX, "tolerance mode: the model's layer calibration runs "
                                        "at the end of the first long enough call when it "
                                        "takes at most this long, else one forward at a time "
                                        "in idle time (default 2000)"),
    STR(admin_group, "group whose members may make admin calls (default llms-admin)"),
    CHOICE(log_level, REQLOG_LEVELS,
           "what goes to stderr (the journal): error (failures of the daemon itself), warn, "
           "or info (also one line per request that used the engine, and every error "
           "answered) (default info)"),
    {"socket_mode", KEY_MODE, offsetof(config, socket_mode), 0, 0, 0777,
     "permission bits of the socket, octal (default 0660)", NULL},
    FLT(temperature, 0, 100, "default temperature, <= 0 greedy (default 0.8)"),
    INT(top_k, 0, INT_MAX, "default top-k, 0 = off (default 40)"),
    FLT(top_p, FLT_MIN, 1, "default top-p, 1 = off (default 0.95)"),
    FLT(min_p, 0, 1, "default min-p, 0 = off (default 0.05)"),
    FLT(repeat_penalty, FLT_MIN, 100, "default repetition penalty, 1 = off (default 1.0)"),
    INT(repeat_last_n, -1, INT_MAX, "default penalized history, -1 = all (default 64)"),
    INT(max_tokens, 1, 1 << 24, "default tokens generated per call at most (default 256)"),
    INT(embed_max_texts, 1, INT_MAX, "texts per Embed request (default 256)"),
    OPT(embed_model, "bert encoder GGUF that answers Embed; none: the model embeds"),
    STR(rerank_model, "reranker GGUF, a decoder or a bert cross-encoder (default: the model)"),
    INT(rerank_stream_weights, 0, 1, "1 = the reranker reads layers from the file instead of "
                                     "mapping them whole (default 1)"),
    INT(rerank_memory_mb, 0, INT_MAX, "reranker activation memory per chunk of candidates in "
                                      "MiB, 0 = the engine's default (default 0)"),
    INT(rerank_yes_token, -1, INT_MAX, "token id scored as \"yes\", -1 = look it up (default -1)"),
    INT(rerank_no_token, -1, INT_MAX, "token id scored as \"no\", -1 = look it up (default -1)"),
    INT(rerank_max_documents, 1, INT_MAX, "documents per Rerank request (default 256)"),
    INT(rerank_max_bytes, 1, INT_MAX, "query + documents bytes per Rerank request "
                                      "(default 4194304)"),
    INT(max_connections, 1, INT_MAX, "connections open at once, every peer together; at "
                                     "most the open-file limit less a reserve (default 1024)"),
    INT(max_connections_per_uid, 1, INT_MAX, "connections one peer uid may hold open "
                                             "(default 64)"),
    INT(bind_timeout_ms, 1, INT_MAX, "a connection that has not sent Bind by then is closed "
                                     "(default 5000)"),
    INT(idle_timeout_ms, 0, INT_MAX, "a bound connection with no request in flight and no "
                                     "traffic for this long is closed, 0 = never "
                                     "(default 3600000)"),
    INT(max_unbound_frame_bytes, 64, INT_MAX, "largest frame accepted before Bind "
                                              "(default 4096)"),
    INT(max_buffered_bytes, 0, INT_MAX, "bytes of partly received frames larger than 64 KiB "
                                        "the daemon holds, every connection together "
                                        "(default 67108864)"),
    INT(max_buffered_bytes_per_uid, 0, INT_MAX, "the same for one peer uid's connections "
                                                "together (default 17825792)"),
    INT(frame_body_timeout_ms, 1, INT_MAX, "a frame over 64 KiB must arrive whole within "
                                           "this long of its header, plus 1 s a MiB, else "
                                           "the connection is closed (default 10000)"),
    INT(max_apps_per_uid, 1, INT_MAX, "app names one uid may have bound at once "
                                      "(default 16)"),
    INT(max_contexts_per_uid, 1, INT_MAX, "contexts one uid may keep, all its apps together "
                                          "(default 1024)"),
    INT(max_queued_per_uid, 1, INT_MAX, "engine requests one uid may have queued or running, "
                                        "all its apps together (default 32)"),
    INT(max_text_bytes, 1, INT_MAX, "bytes of a prompt, system prompt, text to embed or "
                                    "Tokenize input (default 65536)"),
    OPT(http_socket, "Unix socket of the OpenAI-compatible HTTP gateway; a peer is its uid "
                     "(default none: off)"),
    OPT(http_socket_group, "group of http_socket, mode socket_mode (default none: the group "
                           "of the clients' socket, the socket unit's SocketGroup= llms)"),
    OPT(http_listen, "host:port of the HTTP gateway on TCP, loopback only unless "
                     "http_allow_remote; a peer is its bearer token (default none: off)"),
    INT(http_allow_remote, 0, 1, "1 = http_listen may be a non-loopback address (default 0)"),
    OPT(http_tokens_file, "bearer tokens of the TCP gateway: lines 'TOKEN UID APP [admin]' "
                          "(default none: every TCP request is refused)"),
    INT(http_max_body_bytes, 1024, 1 << 30, "largest HTTP request body answered "
                                            "(default 8388608)"),
    INT(http_header_timeout_ms, 1, INT_MAX, "an HTTP request head must arrive whole within "
                                            "this long of the connection (a later request: of "
                                            "its first byte), else 408 and the connection "
                                            "closes (default 10000)"),
    INT(http_body_timeout_ms, 1, INT_MAX, "an HTTP request body must arrive whole within this "
                                          "long of its head, plus 1 s a MiB, else 408 and "
                                          "the connection closes (default 10000)"),
    INT(http_max_body_buffered_bytes, 0, INT_MAX, "bytes of HTTP request bodies being "
                                                  "received, every uid together; a request "
                                                  "whose Content-Length would pass it is 503 "
                                                  "before its body is read (default 67108864)"),
    INT(http_max_body_buffered_bytes_per_uid, 0, INT_MAX, "the same for one uid's requests "
                                                          "together, 429 past it "
                                                          "(default 16777216)"),
    INT(http_max_unauthenticated_connections, 1, INT_MAX, "HTTP connections on TCP that have "
                                                          "not sent a valid token yet, every "
                                                          "peer together (default 16)"),
    INT(kb_passage_tokens, 8, 4096, "tokens of a knowledge base passage unless KbCreate "
                                    "says (default 64)"),
    INT(kb_overlap_tokens, 0, 4095, "tokens consecutive passages share (default 16)"),
    INT(kb_max_per_app, 0, INT_MAX, "knowledge bases of an app (default 16)"),
    INT(kb_max_doc_bytes, 1, INT_MAX, "text bytes of one document (default 1048576)"),
    INT(kb_max_add_bytes, 1, INT_MAX, "text bytes of one KbAdd request (default 4194304)"),
    INT(kb_max_mb_per_uid, 0, INT_MAX, "document text of all a uid's knowledge bases in MiB "
                                       "(default 256)"),
    INT(kb_max_passages_per_uid, 0, INT_MAX, "passages of all a uid's knowledge bases "
                                             "(default 1000000)"),
    INT(kb_ivf_min_passages, 0, INT_MAX, "passages of a knowledge base from which vector "
        "search goes through an IVF index, 0: never (default 10000)"),
    INT(kb_ivf_nprobe, 1, 65536, "lists an IVF search of a knowledge base visits (default 16)"),
    INT(kb_ivf_hot_mb, 0, INT_MAX, "MiB of the knowledge bases' most searched IVF lists kept "
                                   "packed in large pages, refreshed in idle time; 0 = off "
                                   "(default 64)"),
    INT(rag_top_k, 1, 64, "passages a RagQuery puts in its prompt (default 3)"),
    STR(rag_system_prompt, "system prompt of RagQuery unless the request has one"),
    FLT(tau_query, 0, 2, "QA bank: a question this close (cosine) to a stored one is "
                              "answered from it at once; > 1 turns the QA bank off "
                              "(default 0.85)"),
    INT(k_refresh, 1, 64, "a new passage ranking in a stored question's top k_refresh makes "
                          "its answer stale (default 3)"),
    INT(qkv_cache_mb, 0, INT_MAX, "stored QKV prefix tree in MiB (compressed), least "
                                  "frequently used leaves evicted; 0 = off (default 256)"),
    INT(graph_max_per_app, 0, INT_MAX, "workflow graphs an app may keep (default 64)"),
    INT(graph_max_nodes, 1, 1024, "nodes of a workflow graph (default 32)"),
    INT(graph_max_steps, 1, 100000, "node runs of a graph run; a graph's max_steps may not "
                                    "exceed it (default 64)"),
    INT(graph_speculate, 0, 1, "workflow graphs speculate unless a run says otherwise: a "
                               "generation starts on a retrieval's estimate, a retrieval on "
                               "a generation's first tokens (default 0: it measured no "
                               "faster in bench/workflow)"),
    INT(graph_spec_tokens, 1, 65536, "tokens a generation feeding a retrieval has made when "
                                     "the retrieval starts speculatively (default 8)"),
    INT(graph_reuse_kv, 0, 1, "a graph run's generation node starts from the KV of the "
                              "run's previous one where their token prefixes agree "
                              "(default 1)"),
    INT(qa_cache_mb, 0, INT_MAX, "stored QA bank in MiB, oldest entries evicted (default 64)"),
    INT(cache_owner_max_mb, 0, INT_MAX, "MiB one owner (an app, or a uid's shared knowledge "
                                        "bases) may keep in the QKV tree and in the QA bank "
                                        "each, its least used evicted first; 0 = the "
                                        "level's budget (default 128)"),
    INT(cache_owner_max_entries, 0, INT_MAX, "QKV nodes and QA entries one owner may keep "
                                             "(each level); 0 = no limit (default 100000)"),
    INT(predict_budget, 0, 100000, "idle-time prediction: predicted queries (and the "
                                   "generations proposing them) per idle period; 0 = off "
                                   "(default 0)"),
    INT(idle_after_ms, 1, INT_MAX, "no request for this long starts idle-time work: "
                                   "prediction, a layer calibration (default 5000)"),
    INT(predict_stride, 1, 100000, "knowledge-based prediction asks about every stride-th "
                                   "new passage and rewrites a knowledge base's abstract "
                                   "after each stride new passages (default 4)"),
    INT(predict_warm, 0, 1000000, "knowledge-based prediction: new passages prefilled per "
                                  "idle period as a prompt's first passage, into the QKV "
                                  "tree (default 256; only while predict_budget > 0)"),
    INT(predict_max_tokens, 1, 4096, "tokens of a generated abstract, proposed question or "
                                     "paraphrase at most (default 48)"),
    FLT(tau_scheduler, 0, 2, "tau_query at or above this: predicted queries are only "
                                  "prefilled (QKV tree); below: prefilled and decoded (QA "
                                  "bank) (default 0.9)"),
};

#define N_KEYS (sizeof keys / sizeof keys[0])

void config_defaults(config *c)
{
    memset(c, 0, sizeof *c);
    strcpy(c->socket, "/run/llmsd/llmsd.sock");
    strcpy(c->state_dir, "/var/lib/llmsd");
    strcpy(c->model_load, "map");
    c->max_contexts_per_app = 64;
    c->max_queued_per_app = 16;
    strcpy(c->overflow, "window");
    c->window_sink = 4;
    c->step_tokens = 64;
    strcpy(c->sched, "batched");
    c->max_frame_bytes = 16u << 20;
    c->kv_budget_mb = 1024;
    c->kv_wait_ms = 30000;
    c->resident_small_mb = -1;
    strcpy(c->kv_compress, "tolerance");
    c->kv_compress_ratio = 0.6f;
    c->kv_calib_inline_ms = 2000;
    strcpy(c->admin_group, "llms-admin");
    c->socket_mode = 0660;
    strcpy(c->log_level, "info");
    c->temperature = 0.8f;
    c->top_k = 40;
    c->top_p = 0.95f;
    c->min_p = 0.05f;
    c->repeat_penalty = 1.0f;
    c->repeat_last_n = 64;
    c->max_tokens = 256;
    c->embed_max_texts = 256;
    c->rerank_stream_weights = 1;
    c->rerank_yes_token = -1;
    c->rerank_no_token = -1;
    c->rerank_max_documents = 256;
    c->rerank_max_bytes = 4 << 20;
    c->max_connections = 1024;
    c->max_connections_per_uid = 64;
    c->bind_timeout_ms = 5000;
    c->idle_timeout_ms = 3600000;
    c->max_unbound_frame_bytes = 4096;
    c->max_buffered_bytes = 64 << 20;
    c->max_buffered_bytes_per_uid = 17 << 20; /* one frame of the largest default size */
    c->frame_body_timeout_ms = 10000;
    c->max_apps_per_uid = 16;
    c->max_contexts_per_uid = 1024;
    c->max_queued_per_uid = 32;
    c->max_text_bytes = 65536;
    c->http_max_body_bytes = 8 << 20;
    c->http_header_timeout_ms = 10000;
    c->http_body_timeout_ms = 10000;
    c->http_max_body_buffered_bytes = 64 << 20;
    c->http_max_body_buffered_bytes_per_uid = 16 << 20; /* two bodies of the largest default */
    c->http_max_unauthenticated_connections = 16;
    c->kb_passage_tokens = 64;
    c->kb_overlap_tokens = 16;
    c->kb_max_per_app = 16;
    c->kb_max_doc_bytes = 1 << 20;
    c->kb_max_add_bytes = 4 << 20;
    c->kb_max_mb_per_uid = 256;
    c->kb_max_passages_per_uid = 1000000;
    c->kb_ivf_min_passages = 10000;
    c->kb_ivf_nprobe = 16;
    c->kb_ivf_hot_mb = 64;
    c->rag_top_k = 3;
    strcpy(c->rag_system_prompt, "Answer the question using the passages.");
    c->tau_query = 0.85f;
    c->k_refresh = 3;
    c->qkv_cache_mb = 256;
    c->graph_max_per_app = 64;
    c->graph_max_nodes = 32;
    c->graph_max_steps = 64;
    c->graph_speculate = 0;
    c->graph_spec_tokens = 8;
    c->graph_reuse_kv = 1;
    c->qa_cache_mb = 64;
    c->cache_owner_max_mb = 128;
    c->cache_owner_max_entries = 100000;
    c->idle_after_ms = 5000;
    c->predict_stride = 4;
    c->predict_max_tokens = 48;
    c->predict_warm = 256;
    c->tau_scheduler = 0.9f;
}

static const key_def *find_key(const char *name)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if (strcmp(keys[i].name, name) == 0)
            return &keys[i];
    return NULL;
}

#define MODEL_PREFIX "model."

/* A model name: what daemon/models/models.h accepts, checked here so that the settings fail
 * at the line that has it. */
static bool model_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > MODELS_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("._-", s[i]))
            return false;
    return true;
}

int config_known(const char *key)
{
    return find_key(key) != NULL ||
           (strncmp(key, MODEL_PREFIX, strlen(MODEL_PREFIX)) == 0 &&
            model_name_ok(key + strlen(MODEL_PREFIX)));
}

/* "model.NAME = PATH [ROLES]": the path is the value up to its last blank when the
 * rest is a roles list (paths with blanks need a roles list after them). */
static int set_model_line(config *c, const char *key, const char *value, char err[ERR_MAX])
{
    const char *name = key + strlen(MODEL_PREFIX);
    if (!model_name_ok(name))
        return err_set(err, "%.80s: a model name is 1..%d bytes of [A-Za-z0-9._-]", key,
                       MODELS_NAME_MAX);
    size_t n = strlen(value);
    while (n > 0 && isspace((unsigned char)value[n - 1]))
        n--;
    size_t cut = n;
    while (cut > 0 && !isspace((unsigned char)value[cut - 1]))
        cut--;
    const char *roles = "";
    size_t path_len = n, roles_len = cut > 0 ? n - cut : 0;
    if (cut > 0) {
        roles = value + cut;
        path_len = cut;
        while (path_len > 0 && isspace((unsigned char)value[path_len - 1]))
            path_len--;
    }
    if (path_len == 0)
        return err_set(err, "%s: no model file given", key);
    if (path_len >= CONFIG_PATH_MAX)
        return err_set(err, "%s: path longer than %d bytes", key, CONFIG_PATH_MAX - 1);
    if (roles_len >= sizeof c->models[0].roles)
        return err_set(err, "%s: '%.40s' is not a roles list (generate,embed,rerank)", key,
                       roles);
    for (const char *p = value + cut; cut > 0 && p < value + n;) {
        size_t len = strcspn(p, ",");
        if (len > (size_t)(value + n - p))
            len = (size_t)(value + n - p);
        if (!((len == 8 && !strncmp(p, "generate", 8)) || (len == 5 && !strncmp(p, "embed", 5)) ||
              (len == 6 && !strncmp(p, "rerank", 6))))
            return err_set(err, "%s: roles '%.*s': each is generate, embed or rerank", key,
                           (int)roles_len, roles);
        p += len + 1;
    }
    int i = 0;
    while (i < c->n_models && strcmp(c->models[i].name, name) != 0)
        i++;
    if (i == CONFIG_MODELS_MAX)
        return err_set(err, "%s: more than %d model.NAME lines", key, CONFIG_MODELS_MAX);
    config_model *m = &c->models[i];
    strcpy(m->name, name);
    memcpy(m->path, value, path_len);
    m->path[path_len] = '\0';
    memcpy(m->roles, roles, roles_len);
    m->roles[roles_len] = '\0';
    if (i == c->n_models)
        c->n_models++;
    return 0;
}

int config_set(config *c, const char *key, const char *value, char err[ERR_MAX])
{
    if (strncmp(key, MODEL_PREFIX, strlen(MODEL_PREFIX)) == 0)
        return set_model_line(c, key, value, err);
    const key_def *k = find_key(key);
    if (!k)
        return err_set(err, "unknown key '%.80s'", key);
    char *field = (char *)c + k->offset;
    char *end;
    errno = 0;
    switch (k->type) {
    case KEY_OPTIONAL:
        if (strcmp(value, "none") == 0) {
            field[0] = '\0';
            return 0;
        }
        /* Any other value is a string. */
        /* fall through */
    case KEY_STRING:
        if (!*value)
            return err_set(err, "%s: empty value", key);
        if (strlen(value) >= k->size)
            return err_set(err, "%s: value longer than %zu bytes", key, k->size - 1);
        strcpy(field, value);
        return 0;
    case KEY_INT: {
        long long v = strtoll(value, &end, 10);
        if (end == value || *end || errno)
            return err_set(err, "%s: '%s' is not an integer", key, value);
        if ((double)v < k->min || (double)v > k->max)
            return err_set(err, "%s: %lld is outside [%.0f, %.0f]", key, v, k->min, k->max);
        if (strcmp(key, "max_frame_bytes") == 0)
            *(uint32_t *)field = (uint32_t)v;
        else
            *(int *)field = (int)v;
        return 0;
    }
    case KEY_FLOAT: {
        double v = strtod(value, &end);
        if (end == value || *end || errno || v != v)
            return err_set(err, "%s: '%s' is not a number", key, value);
        if (v < k->min || v > k->max)
            return err_set(err, "%s: %g is outside [%g, %g]", key, v, k->min, k->max);
        *(float *)field = (float)v;
        return 0;
    }
    case KEY_CHOICE: {
        size_t n = strlen(value);
        for (const char *p = k->choices; n && *p;) {
            size_t len = strcspn(p, "|");
            if (len == n && strncmp(p, value, n) == 0) {
                strcpy(field, value);
                return 0;
            }
            p += len + (p[len] == '|');
        }
        return err_set(err, "%s: '%s' is not one of %s", key, value, k->choices);
    }
    case KEY_MODE: {
        unsigned long v = strtoul(value, &end, 8);
        if (end == value || *end || errno || value[0] == '-')
            return err_set(err, "%s: '%s' is not an octal mode", key, value);
        if (v > 0777)
            return err_set(err, "%s: %lo is not a permission mode (at most 0777)", key, v);
        *(unsigned *)field = (unsigned)v;
        return 0;
    }
    }
    return err_set(err, "%s: bad key type", key);
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

int config_load(config *c, const char *path, char err[ERR_MAX])
{
    FILE *f = fopen(path, "r");
    if (!f)
        return err_set(err, "%s: %s", path, strerror(errno));
    char line[8192], e[ERR_MAX];
    int lineno = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        size_t n = strlen(line);
        if (n == sizeof line - 1 && line[n - 1] != '\n' && !feof(f)) {
            rc = err_set(err, "%s:%d: line longer than %zu bytes", path, lineno, sizeof line - 2);
            break;
        }
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *s = trim(line);
        if (!*s)
            continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            rc = err_set(err, "%s:%d: expected 'key = value', got '%s'", path, lineno, s);
            break;
        }
        *eq = '\0';
        char *key = trim(s), *value = trim(eq + 1);
        if (config_set(c, key, value, e)) {
            rc = err_set(err, "%s:%d: %s", path, lineno, e);
            break;
        }
    }
    if (!rc && ferror(f))
        rc = err_set(err, "%s: read error", path);
    fclose(f);
    return rc;
}

int config_check(const config *c, char err[ERR_MAX])
{
    if (!c->model[0] && c->n_models == 0)
        return err_set(err, "model: no model file given (set model = PATH, --model PATH or "
                            "model.NAME = PATH generate)");
    if (!c->socket[0])
        return err_set(err, "socket: empty path");
    return 0;
}

void config_print_keys(FILE *out)
{
    for (size_t i = 0; i < N_KEYS; i++)
        fprintf(out, "  --%-24s %s\n", keys[i].name, keys[i].help);
    fprintf(out, "  --%-24s %s\n", "model.NAME",
            "PATH [ROLES]: one more model of the registry, named NAME, with ROLES a comma "
            "list of generate, embed, rerank (default: by the file's kind, a decoder "
            "generates, an encoder embeds, a cross-encoder reranks); repeatable");
}
