/*
 * models.h — the model registry: every model llmsd serves, by name, with its roles.
 *
 * A model has a name (1..MODELS_NAME_MAX bytes of [A-Za-z0-9._-]), a GGUF file and one or
 * more roles: generate (Call, Complete, contexts), embed (Embed) and rerank (Rerank,
 * RerankCalibrate). A request names a model or gets the default of its role: the first
 * model given that role explicitly (model.NAME lines, embed_model, rerank_model), else
 * the generate model, which embeds and reranks when nothing else does (the behaviour of
 * a daemon with one model). Any number of decoders may generate; the first in registry
 * order is the default generate model. The scheduler gives each generate model its own
 * runner, KV pool and context manager (daemon/models/genmodel.h); what runs on one model only
 * (retrieval's generation, prediction) uses the default, which therefore cannot be
 * unloaded. Any decoder may embed: the default generate model in the scheduler's
 * batched steps, every other decoder with the embed role (an embedding model such as
 * Qwen3-Embedding, or another generator) on a runner and KV pool of its own, a text at a
 * time, pooled as its file's {arch}.pooling_type says.
 *
 * Each file is opened once: the generate model and every embed encoder at start (or at
 * models_load), each reranker on its first call (engine/encoder/rerank.h opens its own file,
 * streaming layers or mapping it; a file shared with another role maps the same page
 * cache pages). Only the worker thread touches a registry after models_open returns,
 * except through models_view_update, which any thread may call: the event loop (the
 * HTTP gateway) learns the models' names, roles and chat templates from it.
 *
 * An adapter model (lora.NAME lines, models_load_lora) generates with a generate model's
 * weights and LoRA adapters (engine/model/lora.h): its m is a view of the base's model
 * (model_with_loras), so the base's file is mapped once for all its adapter models, and
 * each costs its adapters' bytes. It has its own contexts, KV and prompt cache, as any
 * generate model (their KV is not the base's: the weights differ). Its base cannot be
 * unloaded while it is loaded.
 */
#ifndef LLMS_MODELS_H
#define LLMS_MODELS_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/config.h"
#include "engine/encoder/bert.h"
#include "engine/tok/chat.h"
#include "engine/err.h"
#include "engine/gguf/gguf.h"
#include "engine/model/embed.h"
#include "engine/model/lora.h"
#include "engine/model/model.h"
#include "engine/encoder/rerank.h"
#include "engine/tok/tokenizer.h"
#include "proto/llms.pb-c.h"

enum models_role {
    MODELS_GENERATE = 1,
    MODELS_EMBED = 2,
    MODELS_RERANK = 4,
    MODELS_DRAFT = 8,   /* drafts tokens for speculative decoding (draft_model) */
};
#define MODELS_ROLES_ALL (MODELS_GENERATE | MODELS_EMBED | MODELS_RERANK | MODELS_DRAFT)

enum models_type { MODELS_DECODER, MODELS_ENCODER, MODELS_CROSS_ENCODER };

typedef struct models_entry {
    char name[MODELS_NAME_MAX + 1];
    char path[CONFIG_PATH_MAX];
    char arch[32];                  /* general.architecture */
    enum models_type type;
    unsigned roles;                 /* enum models_role bits */
    unsigned fallback;              /* roles it has only until another model takes them
                                       (the generate model's embed and rerank) */
    uint64_t file_bytes;
    int64_t file_mtime;             /* its modification time, seconds since the epoch */
    uint64_t n_params;              /* elements of its tensors */
    char quant[12];                 /* its weights' type: general.file_type as llama.cpp
                                       names it ("Q4_K_M"), else the type of most bytes */
    model *m;                       /* a decoder's weights when it generates or embeds */
    enum chat_family family;        /* a generate model's chat template (else CHAT_PLAIN) */
    bool copied;                    /* m was read into private memory (model_load = copy) */
    /* A model that runs apart from the scheduler's steps: its tokenizer, and an
     * encoder's model and runner, or a decoder's (models_embeds_apart: it embeds or
     * drafts) runner and KV pool over m, sized for texts of up to MODELS_EMBED_MAX_TOKENS
     * tokens, and its embedder when it embeds. */
    tokenizer *embed_tok;
    bert_model *enc;
    bert_runner *enc_r;
    model_runner *dec_r;
    kv_pool *dec_pool;
    embedder *dec_emb;
    /* The rerank role: opened on the first Rerank (models_reranker). */
    reranker *rr;
    bool rr_busy;                   /* a rerank or calibration task holds rr */
    uint64_t rr_peak_bytes;         /* memory its last call held */
    int running;                    /* tasks using it (an unload waits for none) */
    /* An adapter model: the generate model whose weights m reads (a view of its m), its
     * adapters, and the adapters as written ("FILE[:SCALE] ...", config_lora_next);
     * NULL, 0 and "" for a model of its own file. path is its first adapter's file. */
    struct models_entry *base;
    lora *lora[CONFIG_LORA_ADAPTERS_MAX];
    int n_lora;
    char lora_spec[CONFIG_PATH_MAX];
    struct models_entry *next;
} models_entry;

typedef struct models models;

/* One model as other threads see it. */
typedef struct models_view_entry {
    char name[MODELS_NAME_MAX + 1];
    unsigned roles;          /* enum models_role bits it answers now (fallbacks included) */
    unsigned defaults;       /* the roles it is the default for */
    enum chat_family family; /* a generate model's chat template (else CHAT_PLAIN) */
    /* What the file says of itself (models_entry's), for the gateway's model lists. */
    char arch[32];
    char path[CONFIG_PATH_MAX]; /* its GGUF file, as the settings or llmsctl load named it */
    uint64_t file_bytes;
    int64_t file_mtime;
    uint64_t n_params;
    char quant[12];
    /* An adapter model's base and adapters as written ("FILE[:SCALE] ..."); "" for others. */
    char base[MODELS_NAME_MAX + 1];
    char lora_spec[CONFIG_PATH_MAX];
} models_view_entry;

/* A copy of the registry's names and roles that a thread other than the worker keeps
 * (zeroed before the first update). */
typedef struct models_view {
    models_view_entry *entries; /* (n) in registry order; cap allocated */
    size_t n, cap;
    uint64_t version;           /* of the registry when copied; 0: never */
} models_view;

/* Tokens the own runner of a decoder that embeds or drafts holds (its n_ctx when
 * smaller). */
#define MODELS_EMBED_MAX_TOKENS 8192

/* Whether e is a decoder that runs on a runner of its own: it has the embed or the draft
 * role and is not the default generate model (which embeds in the scheduler's steps). */
bool models_embeds_apart(const models *r, const models_entry *e);

/* Opens every model of the settings (model, embed_model, rerank_model, model.NAME and
 * lora.NAME lines) with load as the generate model's gguf_load. NULL + err naming the
 * model when a file cannot be opened, is not of a kind its roles need, an adapter does
 * not fit its base (engine/model/lora.h says what is refused), two names clash, or the
 * settings name no generate model. */
models *models_open(const config *cfg, gguf_load load, char err[ERR_MAX]);

/* NULL is allowed. Frees every model; no task may hold one. */
void models_free(models *r);

/* The default generate model: the first with the role (never NULL after models_open). */
models_entry *models_generate(models *r);

/* The model named name, NULL when none. */
models_entry *models_find(models *r, const char *name);

/* The first model, in registry order; entries follow through ->next. */
const models_entry *models_first(const models *r);

/* The model a request of role runs on: the one named (NULL or "": the role's default).
 * LLMS__ERROR_CODE__OK and *out, else NOT_FOUND (no such name: err names the known
 * models) or INVALID_ARGUMENT (it lacks the role: err names its roles). */
Llms__ErrorCode models_resolve(models *r, const char *name, enum models_role role,
                               models_entry **out, char err[ERR_MAX]);

/* Whether e answers role when a request names no model. */
bool models_is_default(const models *r, const models_entry *e, enum models_role role);

/* Adds a model at run time: roles 0 takes them from the file's kind (an encoder embeds,
 * a decoder or a cross-encoder reranks). OK, or the code of the error in err:
 * INVALID_ARGUMENT for a bad name, a file that does not open or roles it cannot serve;
 * FAILED_PRECONDITION for a name or file in use; INTERNAL when memory runs out. A
 * generate model's weights are loaded here; the caller (the scheduler) builds its runner
 * and contexts. */
Llms__ErrorCode models_load(models *r, const char *name, const char *path, unsigned roles,
                            char err[ERR_MAX]);

/* Adds an adapter model at run time: name generates with the generate model base's
 * weights and the adapters (a lora.NAME line's "FILE[:SCALE] ..."). OK, or the code of
 * the error in err: INVALID_ARGUMENT for a bad name, an adapter that does not load or fit
 * base (the file and what is wrong are named), a base that does not generate;
 * NOT_FOUND for no model base; FAILED_PRECONDITION for a name in use; INTERNAL when
 * memory runs out. The caller (the scheduler) builds its runner and contexts. */
Llms__ErrorCode models_load_lora(models *r, const char *name, const char *base,
                                 const char *adapters, char err[ERR_MAX]);

/* Removes a model. NOT_FOUND for an unknown name; FAILED_PRECONDITION for the default
 * generate model, the base of a loaded adapter model, and while a task uses it
 * (e->running: the caller retries after it ends). Another generate model's runner and
 * contexts are the caller's to free first. */
Llms__ErrorCode models_unload(models *r, const char *name, char err[ERR_MAX]);

/* Brings v up to the registry as it is now (every models_open, models_load and
 * models_unload publishes its result before returning); safe from any thread, cheap
 * when nothing changed (a lock and a compare). 0, or -1 when memory runs out (v keeps
 * what it had). */
int models_view_update(models *r, models_view *v);

/* Frees what v holds (v itself is the caller's). */
void models_view_free(models_view *v);

/* The reranker of a model with the rerank role, opened on first use with options. NULL
 * + err when the file does not open as a reranker. */
reranker *models_reranker(models_entry *e, const rerank_options *options, char err[ERR_MAX]);

/* Roles parsed from "generate,embed,rerank,draft" (any order, no repeats). -1 + err. */
int models_parse_roles(const char *s, unsigned *roles, char err[ERR_MAX]);

/* Whether name is a valid model name. */
bool models_name_ok(const char *name);

/* Bytes of e's file in memory now (page cache pages of the mapping, or the copy), plus
 * the private memory its repacked weights added (model_repacked_bytes); an adapter
 * model's: its adapter files' (its base's weights are its base's). */
uint64_t models_resident_bytes(const models_entry *e);

/* Bytes of its runners' working memory that the registry holds (encoder runner, the
 * reranker's last peak); the generate model's runner belongs to the scheduler. */
uint64_t models_scratch_bytes(const models_entry *e);

/* "decoder", "encoder" or "cross-encoder". */
const char *models_type_name(enum models_type t);

/* Names of a role bit ("generate", "embed", "rerank"). */
const char *models_role_name(enum models_role role);

#endif
