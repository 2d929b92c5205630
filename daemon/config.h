/*
 * config.h — llmsd's settings: a "key = value" file with command-line overrides.
 *
 * The file has one setting per line; '#' starts a comment (whole line or after a
 * value), blank lines are ignored, and spaces around key and value are trimmed. Every
 * key can also be given on the command line as --key VALUE; main applies the file
 * first and the flags after it. An unknown key or a bad value is an error naming the
 * key (and, for the file, the file and line).
 *
 * One table in config.c describes every key: its type, range, default and meaning. The
 * defaults, --help and the documentation (the settings table of daemon/README.md, the
 * sample systemd/llmsd.conf) are made from it.
 */
#ifndef LLMS_CONFIG_H
#define LLMS_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "engine/err.h"

#define CONFIG_DEFAULT_PATH "/etc/llmsd/llmsd.conf"
#define CONFIG_PATH_MAX 4096
#define CONFIG_SOCKET_MAX 108 /* sizeof sun_path, NUL included */
#define CONFIG_MODELS_MAX 16  /* model.NAME lines */
#define MODELS_NAME_MAX 48    /* bytes of a model's name (daemon/models/models.h) */

/* A "model.NAME = PATH [ROLES]" line: ROLES is "" (the file's kind decides) or a
 * comma-separated list of generate, embed, rerank. */
typedef struct config_model {
    char name[MODELS_NAME_MAX + 1];
    char path[CONFIG_PATH_MAX];
    char roles[32];
} config_model;

#define CONFIG_LORAS_MAX 16          /* lora.NAME lines */
#define CONFIG_LORA_ADAPTERS_MAX 8   /* adapters of one (engine/model/model.h's MODEL_LORA_MAX) */

/* A "lora.NAME = BASE ADAPTER.gguf[:SCALE] ..." line: a generate model NAME made of the
 * registry model BASE's weights and LoRA adapter files, each at its scale (1 when not
 * given), blank-separated (config_lora_next reads them). */
typedef struct config_lora {
    char name[MODELS_NAME_MAX + 1];
    char base[MODELS_NAME_MAX + 1];
    char adapters[CONFIG_PATH_MAX];
} config_lora;

typedef struct config {
    char model[CONFIG_PATH_MAX];       /* the generate model's GGUF file (or a model.NAME
                                          line with the generate role) */
    config_model models[CONFIG_MODELS_MAX]; /* model.NAME lines, in order */
    int n_models;
    config_lora loras[CONFIG_LORAS_MAX]; /* lora.NAME lines, in order */
    int n_loras;
    char socket[CONFIG_SOCKET_MAX];    /* Unix socket path (unless systemd passes one) */
    char state_dir[CONFIG_PATH_MAX];   /* where the catalog lives */
    char model_load[8];                /* "map" or "copy" (into huge pages): engine/gguf/gguf.h */
    int threads;                       /* engine threads; 0: online cores */
    char device[16];                   /* "cpu", "cuda" or "cuda:N": where generate models
                                          run (engine/cuda/cuda.h, cuda_parse_device) */
    int n_ctx;                         /* tokens per context window; 0: min(model, 4096) */
    int max_contexts_per_app;
    int max_tokens_per_context;        /* 0: n_ctx */
    char chat_template[24];            /* "auto" or a chat family (chat_family_name) */
    char overflow[8];                  /* "window" or "refuse": contexts created without
                                          their own (daemon/ctx/ctxmgr.h) */
    int window_sink;                   /* tokens a sliding window keeps at the start, at
                                          least (whole chunks; the system prompt too) */
    int max_queued_per_app;            /* engine requests of any kind queued or running */
    int step_tokens;                   /* long-work rows per scheduler step */
    char sched[8];                     /* "batched" or "serial" */
    uint32_t max_frame_bytes;
    int kv_budget_mb;                  /* resident KV cap; 0: no cap */
    int prompt_cache_mb;               /* Complete prompts' KV kept for reuse; 0: off */
    int prefill_budget_mb;             /* prefill working memory; 0: none */
    int resident_small_mb;             /* weights resident by size, others stream; -1: all */
    int kv_wait_ms;                    /* longest wait of a call for KV under the cap */
    char kv_compress[16];              /* "tolerance", "int8" or "none" */
    float kv_compress_ratio;           /* tolerance: bytes over their int8 bytes */
    int kv_calib_inline_ms;            /* longer layer calibrations run in idle time */
    char admin_group[64];
    unsigned socket_mode;              /* permission bits of the socket file */
    char log_level[8];                 /* "error", "warn" or "info" (daemon/reqlog.h) */
    /* Generation defaults (a context's defaults and a request's params override them). */
    float temperature;
    int top_k;
    float top_p;
    float min_p;
    float repeat_penalty;
    float frequency_penalty;
    float presence_penalty;
    int repeat_last_n;
    /* llama.cpp's other samplers (engine/model/sampler.h has what each does) */
    int min_keep;
    float typical_p;
    float top_n_sigma;
    float xtc_probability;
    float xtc_threshold;
    float dynatemp_range;
    float dynatemp_exponent;
    float dry_multiplier;
    float dry_base;
    int dry_allowed_length;
    int dry_penalty_last_n;
    int mirostat;
    float mirostat_tau;
    float mirostat_eta;
    int max_tokens;
    /* Speculative decoding (daemon/sched/speculate.h). */
    char speculate[8];                 /* "off", "lookup", "draft" or "both" */
    char draft_model[MODELS_NAME_MAX + 1]; /* a registry model with the draft role; "" */
    int speculate_max;                 /* draft tokens a sequence verifies per step */
    int speculate_rows;                /* a step's rows below which speculation adds rows */
    /* Embed and Rerank (daemon/sched/semantic.h). */
    int embed_max_texts;               /* texts per Embed request */
    char embed_model[CONFIG_PATH_MAX]; /* bert encoder GGUF for Embed; "" (none) = model */
    char rerank_model[CONFIG_PATH_MAX];/* reranker GGUF; "" (none) = model */
    int rerank_stream_weights;         /* 1: read layers from the file, not mapped whole */
    int rerank_memory_mb;              /* activations of one chunk of candidates; 0: engine's */
    int rerank_yes_token;              /* -1: find "yes" in the vocabulary */
    int rerank_no_token;               /* -1: find "no" */
    int rerank_max_documents;          /* documents per Rerank request (and per query of a
                                          calibration) */
    int rerank_max_bytes;              /* query + documents bytes per Rerank request */
    /* Connections and the input they may make the daemon buffer (daemon/net/server.h). */
    int max_connections;               /* open at once, every peer together */
    int max_connections_per_uid;
    int bind_timeout_ms;               /* a connection that has not bound by then closes */
    int idle_timeout_ms;               /* a bound connection with nothing in flight and no
                                          traffic for this long closes; 0: never */
    int max_unbound_frame_bytes;       /* largest frame before Bind */
    int max_buffered_bytes;            /* partial frames over SERVER_SMALL_FRAME, all
                                          connections together */
    int max_buffered_bytes_per_uid;    /* the same, one peer uid's connections together */
    int frame_body_timeout_ms;         /* such a frame's deadline after its header (plus
                                          a second a MiB) */
    /* Quotas of a uid, whatever app names it binds (an app's own come first). */
    int max_apps_per_uid;              /* app names bound at once */
    int max_contexts_per_uid;
    int max_queued_per_uid;
    /* Sizes of request fields. */
    int max_text_bytes;                /* a prompt, system prompt, text or Tokenize input */
    /* The OpenAI-compatible HTTP gateway (daemon/net/http.h); off while both are empty. */
    char http_socket[CONFIG_SOCKET_MAX]; /* Unix socket: identity = the peer's uid */
    char http_socket_group[64];        /* its group; "": the clients' socket's group */
    char http_listen[256];             /* host:port on loopback: identity = bearer token */
    int http_allow_remote;             /* 1: http_listen may name a non-loopback address */
    char http_tokens_file[CONFIG_PATH_MAX]; /* "TOKEN UID APP [admin]" lines */
    int http_max_body_bytes;           /* largest request body answered */
    int http_header_timeout_ms;        /* a request head must arrive whole within this */
    int http_body_timeout_ms;          /* a body within this after its head, plus 1 s a MiB */
    int http_max_body_buffered_bytes;  /* request bodies being received, every uid together */
    int http_max_body_buffered_bytes_per_uid; /* the same, one uid's */
    int http_max_unauthenticated_connections; /* TCP connections with no valid token yet */
    int responses_store_bytes;         /* stored responses (daemon/net/respstore.h); 0: off */
    char responses_store[8];           /* "disk" (also in the store, read back at start:
                                          daemon/respload.h) or "memory" */
    char reasoning_format[12];         /* "auto", "deepseek" (a reply's reasoning apart) or
                                          "none" (left in its text): daemon/net/reasoning.h */
    /* Knowledge bases and RAG (daemon/rag/kb.h, daemon/rag/rag.h). */
    int kb_passage_tokens;             /* tokens of a passage (default of KbCreate) */
    int kb_overlap_tokens;             /* tokens shared by consecutive passages */
    int kb_max_per_app;                /* knowledge bases of an app */
    int kb_max_doc_bytes;              /* text of one document */
    int kb_max_add_bytes;              /* text of one KbAdd request, all documents */
    int kb_max_mb_per_uid;             /* document text of a uid's knowledge bases, MiB */
    int kb_max_passages_per_uid;
    int kb_ivf_min_passages;           /* vector search through an IVF index from this many
                                        * passages of a knowledge base on (0: never) */
    int kb_ivf_nprobe;                 /* lists that search visits */
    int kb_ivf_hot_mb;                 /* hot copies of the most searched IVF lists */
    int rag_top_k;                     /* passages a RagQuery puts in the prompt */
    char rag_system_prompt[1024];
    float tau_query;                   /* QA bank: cosine to a stored question that answers */
    int k_refresh;                     /* a new passage in a stored question's top-k_refresh
                                          makes its answer stale */
    int qkv_cache_mb;                  /* stored QKV prefix tree; 0: off */
    /* Workflow graphs (daemon/graph/graph.h, daemon/graph/graphs.h). */
    int graph_max_per_app;             /* graphs an app keeps */
    int graph_max_nodes;               /* nodes of a graph */
    int graph_max_steps;               /* node runs of a graph run */
    int graph_speculate;               /* runs speculate unless they say otherwise */
    int graph_spec_tokens;             /* a generation's tokens before its retrieval starts */
    int graph_reuse_kv;                /* generation nodes start from the run's last KV */
    int qa_cache_mb;                   /* stored QA bank (oldest entries evicted) */
    int cache_owner_max_mb;            /* what one owner keeps in each level; 0: the level's
                                          budget */
    int cache_owner_max_entries;       /* entries one owner keeps in each level; 0: any */
    /* Idle-time prediction and the cache scheduler (daemon/rag/predict.h). */
    int predict_budget;                /* predicted queries per idle period; 0: off */
    int idle_after_ms;                 /* no request for this long: the daemon is idle
                                          (prediction, layer calibration) */
    int predict_stride;                /* knowledge-based: every stride-th new passage */
    int predict_max_tokens;            /* tokens of an abstract or a proposed question */
    int predict_warm;                  /* new passages prefilled per idle period (QKV) */
    float tau_scheduler;               /* tau_query >= this: predicted queries prefill only */
} config;

/* Sets every key to its built-in default, each parsed and checked as a line of the file
 * would be. -1 with err naming the key when a default is refused (a bug of the table). */
int config_defaults(config *c, char err[ERR_MAX]);

/* Sets one key from its text value. -1 with err naming the key for an unknown key or
 * a bad value. "model.NAME" and "lora.NAME" keys add (or, for a NAME already given,
 * replace) a model of the registry. */
int config_set(config *c, const char *key, const char *value, char err[ERR_MAX]);

/* The next adapter of a lora line's adapters (or any text in their form): *p moves past
 * it; path gets the file, scale the number after its last ':' when that is one (else the
 * whole word is the path, scale 1). 1 when one was read, 0 when none is left, -1 + err
 * for a path too long or a scale that is no finite number. */
int config_lora_next(const char **p, char path[CONFIG_PATH_MAX], float *scale, char err[ERR_MAX]);

/* Whether key is a known setting (for telling flags from mistakes). */
int config_known(const char *key);

/* Applies every setting of the file at path. -1 with err naming the file, the line
 * and the key when a line is malformed, a key unknown or a value bad, or when the file
 * cannot be read. */
int config_load(config *c, const char *path, char err[ERR_MAX]);

/* Checks what a running daemon needs (a model path or model.NAME lines). -1 with err. */
int config_check(const config *c, char err[ERR_MAX]);

/* Writes the list of keys with their meaning and default, in groups, for --help. */
void config_print_keys(FILE *out);

/* The generated documentation of the settings (make settings-docs writes both). */
typedef enum config_doc {
    CONFIG_DOC_MARKDOWN, /* the table of daemon/README.md, CONFIG_DOC_BEGIN to CONFIG_DOC_END */
    CONFIG_DOC_CONF      /* the whole sample llmsd.conf (systemd/llmsd.conf) */
} config_doc;

#define CONFIG_DOC_BEGIN                                                                   \
    "<!-- settings: generated from the table in daemon/config.c by `make settings-docs`; " \
    "edit that table, not these lines -->"
#define CONFIG_DOC_END "<!-- end of the generated settings -->"

/* Writes the documentation of every key in format. -1 with err when out fails. */
int config_print_settings(FILE *out, config_doc format, char err[ERR_MAX]);

#endif
