/*
 * llms.h — libllmsclient, the C client of llmsd (the LLM system service).
 *
 * An app connects to the daemon's Unix socket, binds to an app name, and then creates
 * contexts (persistent conversations kept by the daemon, also across daemon restarts)
 * and calls them; replies stream back token by token through a callback.
 *
 *     #include <llms.h>
 *
 *     static int on_text(const char *text, size_t len, void *user)
 *     {
 *         fwrite(text, 1, len, stdout);
 *         return 0;                        // nonzero cancels the call
 *     }
 *
 *     llms_conn *c;
 *     char err[LLMS_ERROR_MAX], ctx[LLMS_ID_MAX];
 *     if (llms_connect(NULL, &c, err) != LLMS_OK) { fprintf(stderr, "%s\n", err); exit(1); }
 *     if (llms_bind(c, "my-app") != LLMS_OK ||
 *         llms_context_create(c, "You are terse.", NULL, ctx) != LLMS_OK ||
 *         llms_call(c, ctx, "Hello!", NULL, on_text, NULL, NULL) != LLMS_OK)
 *         fprintf(stderr, "llms: %s\n", llms_last_error(c));
 *     llms_close(c);
 *
 * Build with: cc app.c $(pkg-config --cflags --libs llmsclient)
 *
 * Threads: every call is blocking and a connection carries one call at a time. A
 * connection must not be shared between threads without external locking; use one
 * connection per thread (connections are cheap). Different connections are independent.
 * A callback (streamed text, KbAdd progress, graph events) may not make a call on the
 * connection whose call runs it (LLMS_ERR_FAILED_PRECONDITION) nor close it; it may
 * use a second connection.
 *
 * Errors: every function that talks to the daemon returns an enum llms_status: LLMS_OK,
 * one of the daemon's error codes, or LLMS_ERR_IO / LLMS_ERR_PROTOCOL when the
 * connection itself failed (after which the connection is unusable: close it and
 * connect again). llms_last_error() gives the human message of the last failure.
 *
 * Memory: strings and arrays the library hands out are malloc'd; each is freed with
 * free() or with the _free function named at its declaration.
 */
#ifndef LLMS_CLIENT_H
#define LLMS_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Size of a buffer that holds any context id with its terminating NUL. */
#define LLMS_ID_MAX 128
/* Size of the buffer llms_connect() fills with an error message. */
#define LLMS_ERROR_MAX 256
/* Path used by llms_connect() when neither an argument nor $LLMS_SOCKET names one. */
#define LLMS_DEFAULT_SOCKET "/run/llmsd/llmsd.sock"

/* Outcome of a call. Values 1..10 are the daemon's codes (proto ErrorCode). */
enum llms_status {
    LLMS_OK = 0,
    LLMS_ERR_INVALID_ARGUMENT = 1,    /* a field is missing, out of range or malformed, or
                                         the request is larger than a fixed limit (window,
                                         kv budget, frame size, a max_* setting): retrying
                                         cannot help */
    LLMS_ERR_NOT_FOUND = 2,           /* no such context (or not this app's) */
    LLMS_ERR_PERMISSION_DENIED = 3,   /* admin call from a non-admin peer */
    LLMS_ERR_RESOURCE_EXHAUSTED = 4,  /* a limit on what is held or running now (contexts,
                                         queued calls, KV in use, quota): may pass later */
    LLMS_ERR_FAILED_PRECONDITION = 5, /* e.g. a call before llms_bind(), bind twice, a full
                                         context whose overflow is refuse */
    LLMS_ERR_CANCELLED = 6,           /* the call was cancelled (callback or shutdown) */
    LLMS_ERR_INTERNAL = 7,            /* the daemon (or this library) failed */
    LLMS_ERR_UNAVAILABLE = 8,         /* the daemon is shutting down */
    LLMS_ERR_UNIMPLEMENTED = 9,       /* the daemon does not know this call */
    LLMS_ERR_MALFORMED_FRAME = 10,    /* the daemon could not decode a frame */
    LLMS_ERR_DEADLINE_EXCEEDED = 11,  /* the request's timeout (llms_set_timeout) passed */
    LLMS_ERR_IO = 100,                /* connect, read or write failed; connection dead */
    LLMS_ERR_PROTOCOL = 101,          /* the daemon sent something unexpected; dead too */
};

/* A short constant name for a status ("OK", "NOT_FOUND", "IO", ...). */
const char *llms_status_name(enum llms_status s);

/* Why generation stopped (proto StopReason). */
enum llms_stop_reason {
    LLMS_STOP_EOS = 0,          /* the model ended its turn */
    LLMS_STOP_MAX_TOKENS = 1,   /* max_tokens reached */
    LLMS_STOP_STRING = 2,       /* a stop string was generated */
    LLMS_STOP_CONTEXT_FULL = 3, /* the window is full: llms_complete, or a context created
                                   with LLMS_OVERFLOW_REFUSE */
    LLMS_STOP_CANCELLED = 4,    /* cancelled */
    LLMS_STOP_DEADLINE = 5,     /* the request's timeout (llms_set_timeout) passed */
    LLMS_STOP_SHUTDOWN = 6,     /* the daemon is shutting down: the reply is cut */
};

/*
 * A short constant name for a stop reason: "eos", "max_tokens", "stop_string",
 * "context_full", "cancelled", "deadline", "shutdown" ("unknown" for others).
 */
const char *llms_stop_reason_name(enum llms_stop_reason r);

/* Where a context's KV memory is (proto MemoryState). */
enum llms_memory {
    LLMS_MEMORY_NONE = 0,     /* rebuilt from the token history on the next call */
    LLMS_MEMORY_RESIDENT = 1, /* in the daemon's memory */
    LLMS_MEMORY_ON_DISK = 2,  /* swapped out to the daemon's store */
};

/* A short constant name for a memory state: "none", "resident", "on_disk". */
const char *llms_memory_name(enum llms_memory m);

/* An unset integer field of llms_params. */
#define LLMS_UNSET INT32_MIN

/* A number added to one token's logit before every other sampling step (OpenAI's
 * logit_bias): -100 bans the token, 100 all but forces it. */
typedef struct llms_logit_bias {
    int32_t token; /* an id of the model's vocabulary (llms_tokenize gives them) */
    float bias;    /* [-100, 100] */
} llms_logit_bias;

/*
 * Generation settings. Unset fields take the context's defaults, then the daemon's.
 * Start from llms_params_init() (or LLMS_PARAMS_INIT), which leaves everything unset,
 * and set what you need. Floats are unset when NaN, ints when LLMS_UNSET. The fields
 * after speculation came with libllmsclient.so.3, json_schema with .so.4, grammar and
 * ignore_eos with .so.5, those after ignore_eos (llama.cpp's other samplers) with .so.6:
 * an app built against an older llms.h must be rebuilt, which the new soname makes the
 * loader say.
 */
typedef struct llms_params {
    float temperature;      /* <= 0: greedy */
    int32_t top_k;          /* 0: off */
    float top_p;            /* (0, 1]; 1: off */
    float min_p;            /* [0, 1]; 0: off */
    float repeat_penalty;   /* 1: off */
    int32_t repeat_last_n;  /* -1: whole history */
    int32_t max_tokens;     /* tokens to generate at most */
    int has_seed;           /* nonzero: use seed (otherwise a random seed) */
    uint64_t seed;
    const char *const *stop; /* n_stop stop strings (not included in the output) */
    size_t n_stop;
    int raw;                /* llms_call only: append the prompt as is, no chat template */
    const char *model;      /* llms_context_create* and llms_complete: a generate model of
                               the daemon's registry by name (llms_list_models); NULL:
                               the default. A context keeps the model it was made with:
                               llms_call with another model named is
                               LLMS_ERR_FAILED_PRECONDITION. */
    int speculation;        /* enum llms_speculation; LLMS_SPECULATION_DEFAULT: the
                               daemon's `speculate` */
    /* OpenAI's, in [-2, 2]; 0: off. Over the same recent tokens as repeat_penalty, after
       it: a token's logit less frequency_penalty times its count there, and less
       presence_penalty once if it is there at all. */
    float frequency_penalty;
    float presence_penalty;
    const llms_logit_bias *logit_bias; /* (n_logit_bias) at most 1024; a token named twice
                                          gets the sum. Set, the list replaces the
                                          context's whole list, as stop strings do. */
    size_t n_logit_bias;
    int logprobs;           /* nonzero: each generated token's log-probability in
                               llms_result.logprobs (llms_call and llms_complete; a RAG
                               query refuses it); 0 (a zeroed struct too): none */
    int32_t top_logprobs;   /* with logprobs: this many of each step's likeliest tokens
                               beside it, 0..LLMS_LOGPROBS_MAX */
    int format;             /* enum llms_format; LLMS_FORMAT_DEFAULT: the context's */
    const char *json_schema; /* with LLMS_FORMAT_JSON_SCHEMA (and only with it): the JSON
                                Schema the reply must be an instance of, as text */
    const char *grammar;     /* with LLMS_FORMAT_GRAMMAR (and only with it): the GBNF
                                grammar (llama.cpp's) the reply must be a sentence of */
    int ignore_eos;          /* nonzero: the model's end-of-generation tokens are never
                                sampled, so the reply runs to max_tokens, a stop string or
                                a full window (llama.cpp's and vLLM's ignore_eos) */
    /* llama.cpp's other samplers, under its server's names (unset: off, with llama.cpp's
       numbers for their settings; the README's "The engine" says what each does) */
    int32_t min_keep;        /* top-p, min-p, typical and XTC keep this many; 0: one */
    float typical_p;         /* locally typical sampling, (0, 1]; 1 (or 0, a zeroed
                                struct's): off */
    float top_n_sigma;       /* keep logits within n standard deviations of the best;
                                <= 0: off */
    float xtc_probability;   /* XTC: how often the top choices go, [0, 1]; 0: off */
    float xtc_threshold;     /* [0, 1]: the probability of a top choice; above 0.5: off */
    float dynatemp_range;    /* dynamic temperature: temperature +- this by the entropy,
                                [0, 100]; 0: off */
    float dynatemp_exponent; /* [0, 100] */
    float dry_multiplier;    /* DRY (a token extending a repetition loses multiplier *
                                base ^ (length - allowed)), [0, 100]; 0: off */
    float dry_base;          /* [1, 100]; 0 (a zeroed struct's): llama.cpp's 1.75 */
    int32_t dry_allowed_length;  /* >= 0 */
    int32_t dry_penalty_last_n;  /* tokens looked back at; -1: the window; 0: off */
    const char *const *dry_sequence_breakers; /* (n_dry_sequence_breakers, at most 64) texts
                                                 a repetition is not followed back past;
                                                 none: llama.cpp's "\n" ":" "\"" "*" */
    size_t n_dry_sequence_breakers;
    int32_t mirostat;        /* Mirostat in place of the chain: 0 off, 1 or 2 */
    float mirostat_tau;      /* the surprise it aims at, in bits, [0, 100] */
    float mirostat_eta;      /* its learning rate, [0, 1] */
    const char *samplers;    /* the samplers that run, in this order, as llama.cpp's letters
                                (e penalties, d DRY, s top-n-sigma, k top-k, y typical, p
                                top-p, m min-p, x XTC, t temperature), each once; NULL: all,
                                in that order. Set, it replaces the context's. */
} llms_params;

/* What a reply must be (proto ResponseFormat). */
enum llms_format {
    LLMS_FORMAT_DEFAULT = 0,     /* the context's default, else free text */
    LLMS_FORMAT_TEXT = 1,        /* free text */
    LLMS_FORMAT_JSON_OBJECT = 2, /* JSON mode: one JSON object, sampled only from tokens
                                    that keep it a valid prefix; the reply ends as it
                                    closes (max_tokens may cut it short) */
    LLMS_FORMAT_JSON_SCHEMA = 3, /* JSON mode, and an instance of llms_params.json_schema
                                    (an object or an array; keys in the order of its
                                    properties). A schema with a keyword the daemon cannot
                                    enforce (uniqueItems, ...) is LLMS_ERR_INVALID_ARGUMENT */
    LLMS_FORMAT_GRAMMAR = 4,     /* a sentence of llms_params.grammar, sampled only from
                                    tokens that keep it a prefix of one; the reply ends
                                    where nothing more may follow. A grammar that does not
                                    compile is LLMS_ERR_INVALID_ARGUMENT naming the line */
};

/* Speculative decoding of a generation (proto Speculation): greedy output is the same
 * either way, sampling keeps its distribution; LOOKUP verifies the tokens that followed
 * the reply's last few tokens earlier in its context, several per forward; DRAFT those a
 * small model of the same vocabulary (the daemon's draft_model) writes. */
enum llms_speculation {
    LLMS_SPECULATION_DEFAULT = 0,
    LLMS_SPECULATION_OFF = 1,
    LLMS_SPECULATION_LOOKUP = 2,
    LLMS_SPECULATION_DRAFT = 3,  /* the daemon's draft_model drafts (none without one) */
    LLMS_SPECULATION_BOTH = 4,   /* lookup, else the draft model */
};

#define LLMS_PARAMS_INIT                                                              \
    {                                                                                 \
        __builtin_nanf(""), LLMS_UNSET, __builtin_nanf(""), __builtin_nanf(""),       \
            __builtin_nanf(""), LLMS_UNSET, LLMS_UNSET, 0, 0, NULL, 0, 0, NULL, 0,     \
            __builtin_nanf(""), __builtin_nanf(""), NULL, 0, 0, 0, 0, NULL, NULL, 0,  \
            LLMS_UNSET, __builtin_nanf(""), __builtin_nanf(""), __builtin_nanf(""),   \
            __builtin_nanf(""), __builtin_nanf(""), __builtin_nanf(""),               \
            __builtin_nanf(""), __builtin_nanf(""), LLMS_UNSET, LLMS_UNSET, NULL, 0,   \
            LLMS_UNSET, __builtin_nanf(""), __builtin_nanf(""), NULL                   \
    }

/* Sets every field of *p to unset. */
void llms_params_init(llms_params *p);

/* The most alternatives llms_params.logprobs may ask for beside each token. */
#define LLMS_LOGPROBS_MAX 20

/* A generated token's log-probability (proto TokenLogprob): the model's own log-softmax
 * at temperature 1, before logit biases, penalties and truncation. */
typedef struct llms_token_logprob {
    int32_t token;
    float logprob;                        /* <= 0; -INFINITY where the model gave none */
    int n_top;                            /* the alternatives asked for (fewer in a tiny
                                             vocabulary) */
    int32_t top_token[LLMS_LOGPROBS_MAX]; /* (n_top) the step's likeliest, first first */
    float top_logprob[LLMS_LOGPROBS_MAX]; /* (n_top) */
} llms_token_logprob;

/* Outcome of a generation (proto CallResult). */
typedef struct llms_result {
    uint32_t prompt_tokens;    /* tokens of the prompt (a call's turn), those resumed from
                                  the daemon's prompt cache included */
    uint32_t generated_tokens;
    uint32_t context_tokens;   /* context length after the call (0 for llms_complete) */
    double prefill_ms;
    double decode_ms;
    double queue_ms;           /* time spent waiting for a worker */
    enum llms_stop_reason stop_reason;
    char *text;                /* the whole reply; free with llms_result_free() */
    uint32_t window_slides;    /* times the context's window slid during the call */
    llms_token_logprob *logprobs; /* (n_logprobs) one per generated token, when
                                     llms_params.logprobs asked; else NULL */
    size_t n_logprobs;
    uint32_t cached_tokens;    /* llms_complete: prompt tokens resumed from the daemon's
                                  prompt cache, not evaluated again (among prompt_tokens) */
} llms_result;

/* Frees what *r holds (not r itself) and zeroes it. NULL is fine. */
void llms_result_free(llms_result *r);

/*
 * What a context does when a call fills its window (the daemon's n_ctx, or
 * max_tokens_per_context when lower) (proto Overflow).
 */
enum llms_overflow {
    LLMS_OVERFLOW_DEFAULT = 0, /* the daemon's setting `overflow` (window unless set) */
    LLMS_OVERFLOW_WINDOW = 1,  /* slide: the first tokens (attention sinks, the system
                                  prompt) and the most recent stay, the middle leaves the
                                  model's view (the messages keep it), the reply goes on */
    LLMS_OVERFLOW_REFUSE = 2,  /* the reply stops with LLMS_STOP_CONTEXT_FULL and every
                                  later call fails with LLMS_ERR_FAILED_PRECONDITION */
};

/* "default", "window", "refuse" ("unknown" for others). */
const char *llms_overflow_name(enum llms_overflow o);

/*
 * Receives each streamed piece of a reply: len bytes of UTF-8 text at text (not
 * NUL-terminated), safe to show as is. Return 0 to go on, nonzero to cancel the call.
 */
typedef int (*llms_token_cb)(const char *text, size_t len, void *user);

typedef struct llms_conn llms_conn;

/*
 * Connects to the daemon at socket_path; NULL means $LLMS_SOCKET, or LLMS_DEFAULT_SOCKET
 * when that is unset. On success *out is the new connection. On failure err (when not
 * NULL) gets a message and LLMS_ERR_IO (or LLMS_ERR_INTERNAL when out of memory) is
 * returned.
 */
enum llms_status llms_connect(const char *socket_path, llms_conn **out,
                              char err[LLMS_ERROR_MAX]);

/* Closes the connection and frees it. Contexts stay in the daemon. NULL is fine. */
void llms_close(llms_conn *conn);

/*
 * Every request sent on conn after this call carries a deadline: work the daemon has not
 * finished timeout_ms after it received the request stops (LLMS_ERR_DEADLINE_EXCEEDED,
 * or a reply cut with LLMS_STOP_DEADLINE). 0 (the default) means no deadline.
 */
void llms_set_timeout(llms_conn *conn, uint32_t timeout_ms);

/*
 * The message of the last failed call on conn ("" when none). Valid until the next call
 * on conn.
 */
const char *llms_last_error(const llms_conn *conn);

/*
 * The app name of every llmsd client when its user names none: this library, llms,
 * Python, and the HTTP gateway without an X-Llmsd-App header. A knowledge base or context
 * made through one of them is found through the others.
 */
#define LLMS_DEFAULT_APP "default"

/*
 * The app llms_bind(conn, NULL) binds to: $LLMS_APP when it is set and not empty, else
 * LLMS_DEFAULT_APP.
 */
const char *llms_default_app(void);

/*
 * Attaches the connection to an app: 1..64 bytes of [A-Za-z0-9._-], or NULL for
 * llms_default_app(). The app's identity is (your uid, app_name); contexts, knowledge
 * bases, graphs and caches belong to it. Every call but the admin ones needs a bound
 * connection. A connection binds once.
 */
enum llms_status llms_bind(llms_conn *conn, const char *app_name);

/*
 * Creates a context with an optional system prompt and default generation settings
 * (params; NULL for the daemon's). Its id (an unguessable string) is written to id_out.
 * RESOURCE_EXHAUSTED when the app has as many contexts as it may.
 */
enum llms_status llms_context_create(llms_conn *conn, const char *system_prompt,
                                     const llms_params *params, char id_out[LLMS_ID_MAX]);

/* llms_context_create with the context's overflow policy (kept with it, also across
 * daemon restarts). */
enum llms_status llms_context_create_overflow(llms_conn *conn, const char *system_prompt,
                                              const llms_params *params,
                                              enum llms_overflow overflow,
                                              char id_out[LLMS_ID_MAX]);

/*
 * One user turn in a context: prompt is added as a user message, the reply is generated,
 * kept in the context and streamed to on_text (may be NULL). When on_text returns
 * nonzero the call is cancelled: the daemon is told, the library waits for the call's
 * last frame and returns LLMS_ERR_CANCELLED. out (may be NULL) gets the outcome when the
 * call finished or was cancelled after the daemon sent it; free it with
 * llms_result_free(). params may be NULL. Calls on one context are serialised by the
 * daemon. INVALID_ARGUMENT when the turn (or its KV, with max_tokens) can never fit
 * the window or the daemon's kv_budget_mb; FAILED_PRECONDITION when a context whose
 * overflow is refuse is full; RESOURCE_EXHAUSTED when the app has as many calls queued
 * as it may, or running calls hold the KV memory past the daemon's kv_wait_ms.
 */
enum llms_status llms_call(llms_conn *conn, const char *context_id, const char *prompt,
                           const llms_params *params, llms_token_cb on_text, void *user,
                           llms_result *out);

/*
 * llms_call without streaming: *text_out gets the whole reply (malloc'd, free() it),
 * or NULL on failure.
 */
enum llms_status llms_call_text(llms_conn *conn, const char *context_id, const char *prompt,
                                const llms_params *params, char **text_out);

/*
 * Stateless one-shot generation: nothing is kept. With chat nonzero the prompt is
 * wrapped as a user message (after system_prompt, may be NULL) in the model's chat
 * template; otherwise the model simply continues the prompt. Streaming, cancelling and
 * out behave as in llms_call().
 */
enum llms_status llms_complete(llms_conn *conn, const char *prompt, const char *system_prompt,
                               int chat, const llms_params *params, llms_token_cb on_text,
                               void *user, llms_result *out);

/* Deletes one of the app's contexts and everything the daemon kept for it. */
enum llms_status llms_context_delete(llms_conn *conn, const char *context_id);

/* One message of a context's history. */
typedef struct llms_message {
    char *role;    /* "system", "user" or "assistant" */
    char *content;
} llms_message;

/* One 16-token chunk of a context's KV (proto ChunkInfo). */
typedef struct llms_chunk_info {
    uint32_t index;             /* covers tokens [16 index, 16 index + 16) */
    uint32_t n_tokens;
    int resident;               /* in the daemon's memory */
    int on_disk;                /* in its store */
    uint32_t bits;              /* precision: 16, 8, 4 or 2 (0: neither resident nor stored) */
    float density;              /* attention its tokens receive per attending row */
} llms_chunk_info;

/* What the daemon says about a context (proto ContextInfo). */
typedef struct llms_context_info {
    char id[LLMS_ID_MAX];
    char *app_name;             /* admin listings only, else NULL */
    int has_uid;                /* admin listings only */
    uint32_t uid;
    uint32_t n_tokens;          /* tokens in the context (prompt + replies) */
    uint64_t created_unix_ms;
    uint64_t last_used_unix_ms;
    enum llms_memory memory;
    char *system_prompt;        /* NULL when none */
    uint64_t kv_bytes;          /* resident KV bytes (0 when not reported) */
    llms_message *history;      /* n_history messages; only from llms_context_get() with
                                   history asked for */
    size_t n_history;
    llms_chunk_info *chunks;    /* n_chunks: the chunk map, from the get calls only */
    size_t n_chunks;
    enum llms_overflow overflow;     /* WINDOW or REFUSE (DEFAULT from an older daemon) */
    uint64_t window_slides;          /* times its window slid */
    uint64_t window_dropped_tokens;  /* tokens of its history out of the model's view */
    char *model;                     /* the generate model it belongs to (NULL from an
                                        older daemon) */
    char *damage;                    /* NULL, or why its stored data is damaged: it has no
                                        history, its calls fail with
                                        LLMS_ERR_FAILED_PRECONDITION, deleting it clears it */
} llms_context_info;

/* Frees what *info holds (not info itself). NULL is fine. */
void llms_context_info_free(llms_context_info *info);

/* Frees an array of n infos from a listing, and the array. NULL is fine. */
void llms_context_list_free(llms_context_info *infos, size_t n);

/* The app's contexts: *out gets n (*n_out) infos; free with llms_context_list_free(). */
enum llms_status llms_context_list(llms_conn *conn, llms_context_info **out, size_t *n_out);

/*
 * One context of the app; with_history nonzero also fetches its messages. Free *out
 * with llms_context_info_free().
 */
enum llms_status llms_context_get(llms_conn *conn, const char *context_id, int with_history,
                                  llms_context_info *out);

/*
 * Tokenizes text with the daemon's default generate model. add_special: add BOS etc. as the model wants;
 * parse_special: text like "<|im_start|>" becomes special tokens. *tokens_out (free())
 * gets *n_out ids.
 */
enum llms_status llms_tokenize(llms_conn *conn, const char *text, int add_special,
                               int parse_special, int32_t **tokens_out, size_t *n_out);

/* Frees what a call handed over to free() (llms_tokenize's ids, llms_detokenize's
 * text, llms_call_text's reply): for bindings that cannot reach the C library's free().
 * NULL is fine. */
void llms_free(void *p);

/* Turns n token ids back into text: *text_out (free()). */
enum llms_status llms_detokenize(llms_conn *conn, const int32_t *tokens, size_t n,
                                 char **text_out);

/* llms_tokenize and llms_detokenize with the tokenizer of the model named model (a
 * generate or embed model of the registry; NULL: the default generate model's).
 * NOT_FOUND for a name the daemon does not know, INVALID_ARGUMENT for a model without a
 * tokenizer loaded (a reranker). */
enum llms_status llms_tokenize_model(llms_conn *conn, const char *model, const char *text,
                                     int add_special, int parse_special, int32_t **tokens_out,
                                     size_t *n_out);
enum llms_status llms_detokenize_model(llms_conn *conn, const char *model,
                                       const int32_t *tokens, size_t n, char **text_out);

/* ---- embeddings and reranking ---- */

/* How token states are pooled into one vector (proto Pooling). */
enum llms_pooling {
    LLMS_POOLING_LAST = 0, /* the last token's (Qwen3-Embedding) */
    LLMS_POOLING_MEAN = 1, /* the mean over the text's tokens */
    LLMS_POOLING_CLS = 2,  /* the first token's (BERT's [CLS]) */
    LLMS_POOLING_MODEL = -1, /* the model's own ({arch}.pooling_type; a decoder without
                                one: the last token, an encoder without one: cls) */
};

/* Vectors of llms_embed(): n unit-length rows of dim floats. */
typedef struct llms_embeddings {
    size_t n;
    uint32_t dim;
    float *values;       /* (n, dim) row i is text i's vector */
    uint32_t *n_tokens;  /* (n) tokens of each text */
} llms_embeddings;

/* Frees what *e holds (not e itself) and zeroes it. NULL is fine. */
void llms_embeddings_free(llms_embeddings *e);

/*
 * Embeds n texts with the daemon's model (final-norm'd last-layer states, pooled,
 * L2-normalised). INVALID_ARGUMENT for no texts, a text with no tokens or more than
 * the context window, or more texts than the daemon's limits allow. Free *out with
 * llms_embeddings_free().
 */
enum llms_status llms_embed(llms_conn *conn, const char *const *texts, size_t n,
                            enum llms_pooling pooling, llms_embeddings *out);

/* llms_embed on the embed model named model (NULL: the default). NOT_FOUND for a name
 * the daemon does not know, INVALID_ARGUMENT for a model without the embed role. */
enum llms_status llms_embed_model(llms_conn *conn, const char *model, const char *const *texts,
                                  size_t n, enum llms_pooling pooling, llms_embeddings *out);

/* One model of the daemon's registry (proto ModelInfo). */
typedef struct llms_model_info {
    char *name;
    char *path;
    char *arch;             /* general.architecture: llama, qwen2, qwen3, phi3, granite,
                               qwen2moe, qwen3moe, olmoe, gemma, gemma2, gemma3, olmo2,
                               granitemoe, smollm3, exaone, exaone4, stablelm, mistral3,
                               glm4, chatglm, command-r, cohere2, starcoder2, phi2, seed_oss,
                               hunyuan-dense, deepseek2, ernie4_5-moe, glm4moe,
                               gpt-oss,
                               internlm2, ernie4_5, xverse, qwen2vl, qwen3vl, qwen3vlmoe
                               (their text models), bert, nomic-bert, gemma-embedding */
    char *type;             /* "decoder", "encoder" or "cross-encoder" */
    uint64_t file_bytes;
    char *roles;            /* "generate,embed,rerank,draft" or a part of it */
    char *default_for;      /* the roles it answers when a request names no model */
    uint64_t resident_bytes; /* its weights in memory now */
    uint64_t scratch_bytes;  /* its runners' working memory */
    uint32_t running;       /* requests using it now */
    int generates;          /* nonzero for a generate model: the three below are set */
    uint32_t contexts;      /* contexts that belong to it */
    uint64_t kv_bytes;      /* resident KV of its contexts and generations */
    uint64_t kv_budget_bytes; /* its share of kv_budget_mb (0: no cap) */
} llms_model_info;

/* Frees an array of n model infos and the array. NULL is fine. */
void llms_model_list_free(llms_model_info *models, size_t n);

/* The daemon's models (any bound connection, or an admin's): *out gets *n_out infos;
 * free with llms_model_list_free(). */
enum llms_status llms_list_models(llms_conn *conn, llms_model_info **out, size_t *n_out);

/* Admin: maps the GGUF file at path (as the daemon sees it) as model name with roles
 * (comma-separated generate, embed, rerank; NULL or "": by the file's kind, a decoder
 * reranks: "generate" must be asked for). A generate model gets its own runner and KV
 * and takes back the contexts made with it before. Other models and their contexts are
 * untouched. FAILED_PRECONDITION for a name or file in use; INVALID_ARGUMENT for a file
 * that does not fit its roles, and for the draft role (draft_model is fixed at start). */
enum llms_status llms_model_load(llms_conn *conn, const char *name, const char *path,
                                 const char *roles);

/* Admin: an adapter model (llmsd.conf's lora.NAME lines): name generates with the weights
 * of the generate model base (mapped once, shared) and LoRA adapter files in llama.cpp's
 * format, adapters as a lora.NAME line writes them, "FILE[:SCALE] ..." (scale 1 when not
 * given). It gets its own KV and contexts. NOT_FOUND for no model base;
 * INVALID_ARGUMENT for an adapter that does not load or fit the base (the message names
 * the file and what is wrong); FAILED_PRECONDITION for a name in use. */
enum llms_status llms_model_load_lora(llms_conn *conn, const char *name, const char *base,
                                      const char *adapters);

/* Admin: forgets model name. FAILED_PRECONDITION while requests use it (retry after
 * they end), for a generate model that has contexts (the message names them) and for
 * the default generate model; NOT_FOUND for an unknown name. */
enum llms_status llms_model_unload(llms_conn *conn, const char *name);

/* What a rerank keeps exact (proto RerankMode). */
enum llms_rerank_mode {
    LLMS_RERANK_SET = 0,     /* which documents are in the top-K */
    LLMS_RERANK_ORDERED = 1, /* also their order and scores */
};

/*
 * Rerank options; start from llms_rerank_options_init() (or LLMS_RERANK_OPTIONS_INIT),
 * which leaves everything to the daemon. The pruning threshold is cv_threshold when
 * set, else the threshold calibrated (llmsctl rerank-calibrate) for target_precision
 * when set, else the daemon's default.
 */
typedef struct llms_rerank_options {
    uint32_t top_k;           /* 0: 5 */
    enum llms_rerank_mode mode;
    float cv_threshold;       /* NaN: unset; <= 0: no pruning (the full forward) */
    float target_precision;   /* NaN: unset; (0, 1] */
    int stream_weights;       /* -1: the daemon's rerank_stream_weights; 0 or 1 */
    const char *model;        /* a rerank model of the registry by name; NULL: the default */
} llms_rerank_options;

#define LLMS_RERANK_OPTIONS_INIT \
    { 0, LLMS_RERANK_SET, __builtin_nanf(""), __builtin_nanf(""), -1, NULL }

void llms_rerank_options_init(llms_rerank_options *o);

typedef struct llms_rerank_hit {
    uint32_t index;  /* into the documents given */
    float score;     /* in [0, 1], the last layer's; NaN for a document LLMS_RERANK_SET
                        selected before the last layer (its membership is exact, its
                        score unfinished) */
} llms_rerank_hit;

/* Outcome of llms_rerank() (proto RerankResponse). */
typedef struct llms_rerank_result {
    size_t n_hits;
    llms_rerank_hit *hits;       /* (n_hits) best first; when a score is NaN only the
                                    membership is exact, not the order */
    size_t n_documents;
    uint32_t *layers_computed;   /* (n_documents) layers each document went through */
    size_t n_layer;
    uint32_t *pruned_at_layer;   /* (n_layer) documents that stopped after each layer */
    uint64_t peak_bytes;         /* memory the reranker held for the call */
    double time_ms;
    float cv_threshold;          /* the threshold used */
} llms_rerank_result;

/* Frees what *r holds (not r itself) and zeroes it. NULL is fine. */
void llms_rerank_result_free(llms_rerank_result *r);

/*
 * The top-K of n documents for query, scored by the daemon's reranker. opts may be
 * NULL. INVALID_ARGUMENT for an empty query, no documents, bad options, more
 * documents or bytes than the daemon's limits allow, or a query that leaves no room
 * for a document in the reranker's window (longer documents are cut to fit);
 * FAILED_PRECONDITION when target_precision has no calibrated threshold. Free *out
 * with llms_rerank_result_free().
 */
enum llms_status llms_rerank(llms_conn *conn, const char *query, const char *const *documents,
                             size_t n, const llms_rerank_options *opts, llms_rerank_result *out);

/* ---- admin calls: the peer must be root or in the group llms-admin ---- */

/* The switch-in cost models, in milliseconds (proto CostModels): recomputing t tokens
 * of a context of n costs rec_a + rec_b t + rec_c t n; reading f chunk files of b bytes
 * out of the page cache io_d + io_f f + io_e b, in it warm_d + warm_f f + warm_e b.
 * *_resid: RMS relative residual of the profile's medians against each line; samples:
 * timed runs per point (0: not measured). The *_fix corrections multiply the lines,
 * learned from real switch-ins; *_contention: a part's slowdown while the other runs.
 * Ratios: observed / predicted, median over the last 64 switch-ins and the last one (0
 * when none yet). */
typedef struct llms_cost_models {
    double rec_a, rec_b, rec_c;
    double io_d, io_e;
    double warm_d, warm_e;
    double io_f, warm_f;
    double rec_resid, io_resid, warm_resid;
    uint32_t samples;
    double rec_fix, cold_fix, warm_fix;
    double rec_contention, read_contention;
    uint64_t observed;                 /* switch-ins measured since the profile */
    double rec_ratio_median, rec_ratio_last;
    double read_ratio_median, read_ratio_last;
    double total_ratio_median, total_ratio_last;
} llms_cost_models;

/* The daemon's state (proto StatusResponse). */
typedef struct llms_daemon_status {
    char *version;
    char *model_path;
    char *model_arch;
    uint64_t model_bytes;
    uint32_t n_ctx;
    uint32_t threads;
    uint64_t uptime_ms;
    uint32_t n_connections;
    uint32_t n_apps;          /* apps bound now (llms_list_apps: all with contexts) */
    uint32_t n_contexts;
    uint32_t n_resident_contexts;
    uint64_t kv_bytes_resident;
    uint32_t queued_requests;
    uint32_t running_requests;
    uint64_t rss_bytes;
    /* Context memory: the budget (0: none) and swap totals since the daemon started. */
    uint64_t kv_budget_bytes;
    uint64_t swap_bytes_written, swap_bytes_read;
    uint64_t swap_chunks_written, swap_chunks_read, swap_chunks_recomputed;
    uint64_t swap_faults;       /* chunks brought in during a forward (normally 0) */
    uint64_t swap_bad_blobs;    /* stored chunks found corrupt or missing (recomputed) */
    uint64_t switch_ins;
    double switch_in_mean_ms;
    /* The step scheduler (each step advances all running work in one forward pass). */
    char *sched_mode;                /* "batched" or "serial" */
    uint32_t sched_step_tokens;      /* row budget of a step */
    uint32_t sched_active_sequences; /* generations decoding or prefilling */
    uint32_t sched_queued_generate, sched_queued_embed, sched_queued_rerank;
    uint64_t sched_steps;            /* since the daemon started */
    double sched_step_mean_ms;       /* last minute */
    double sched_rows_per_step;      /* last minute */
    double sched_longest_stall_ms;   /* longest gap between two tokens of a stream,
                                        last minute */
    /* Ahead-of-time swap-out, on its own thread. */
    uint32_t swap_writes_pending;    /* chunk batches queued or being written now */
    uint64_t swap_write_waits;       /* times the worker waited for one */
    double swap_write_wait_ms;       /* in all */
    uint64_t swap_write_failures;    /* batches that could not be written */
    uint64_t swap_stale_blobs;       /* stored chunks of a history that moved on before
                                        they were written again (recomputed; expected
                                        after a crash, not corruption) */
    /* Resident KV by precision (adding up to kv_bytes_resident) and the KV pool's spare
     * buffers; kv_budget_bytes caps resident + spare. */
    uint64_t kv_f16_bytes, kv_int8_bytes, kv_int4_bytes, kv_int2_bytes;
    uint64_t kv_spare_bytes;
    /* Sliding windows since the daemon started: slides, and the tokens they dropped. */
    uint64_t window_slides, window_dropped_tokens;
    /* Compressed chunks recomputed to get wider codes when they became important again. */
    uint64_t swap_chunks_promoted;
    llms_cost_models cost;           /* zero from a daemon that does not report them */
    /* Every model of the registry together: weights in memory and runners' scratch
     * (llms_list_models has them per model). */
    uint64_t models_resident_bytes, models_scratch_bytes;
    /* Workflow graph speculation since the daemon started: work started on provisional
     * outputs, kept (hits) and dropped (rollbacks), and how long kept work ran ahead. */
    uint64_t graph_speculations, graph_spec_hits, graph_spec_rollbacks;
    double graph_spec_saved_ms;
    /* Layer calibrations of KV compression: generate models calibrated, forwards of
     * calibrations waiting for idle time, calibrations measured since the start. */
    uint32_t kv_calibrated_models, kv_calib_forwards_left;
    uint64_t kv_calibrations;
    /* Knowledge bases' IVF searches: searches, those with a request's similarity hints,
     * lists scanned, lists the early stop left out; bytes in the hot copies. */
    uint64_t kb_ivf_searches, kb_ivf_hinted_searches, kb_ivf_lists_scanned,
        kb_ivf_lists_skipped, kb_ivf_hot_bytes;
    /* IVF indexes trained in idle time; whether a knowledge base waits for its index
     * (searched by brute force meanwhile). */
    uint64_t kb_ivf_trained;
    uint32_t kb_ivf_train_pending;
    /* QKV nodes found under a RAG query's key whose owner or token prefix was not the
     * query's (a forged row or a hash collision), each used as a miss. */
    uint64_t qkv_verify_misses;
    /* Knowledge bases on disk: visible passages, their text bytes, and the bytes of the
     * catalog pages that hold them (0 from a daemon that does not say). The daemon
     * measures those bytes in idle time (reading every page is too slow for a status
     * call): kb_disk_measured is 0 until a first measurement ended, and the figure may
     * lag the latest writes until the next idle period. */
    uint64_t kb_passages, kb_text_bytes, kb_disk_bytes;
    int kb_disk_measured;
    /* Speculative decoding with prompt-lookup drafts: steps where a generation verified
     * drafts, the draft tokens verified, those accepted (each saved a step). */
    uint64_t spec_lookup_steps, spec_lookup_proposed, spec_lookup_accepted;
    uint64_t spec_draft_steps, spec_draft_proposed, spec_draft_accepted; /* draft_model's */
    /* Contexts whose stored data is damaged, among n_contexts (their calls fail until
     * they are deleted; the daemon's log names each). */
    uint32_t damaged_contexts;
    /* The prompt cache (prompt_cache_mb), every generate model's: Completes that resumed
     * a kept prompt (hits) or found none (misses), the tokens they did not evaluate
     * again, and what it holds now. */
    uint64_t prompt_cache_hits, prompt_cache_misses, prompt_cache_reused_tokens;
    uint64_t prompt_cache_bytes;
    uint32_t prompt_cache_entries;
} llms_daemon_status;

/* Frees the strings in *s (not s itself). NULL is fine. */
void llms_daemon_status_free(llms_daemon_status *s);

/*
 * The daemon's status. (Named llms_status_get because enum llms_status is the type of
 * every result.) Free *out with llms_daemon_status_free().
 */
enum llms_status llms_status_get(llms_conn *conn, llms_daemon_status *out);

/* One app the daemon knows (proto AppInfo). */
typedef struct llms_app_info {
    uint32_t uid;
    char *app_name;
    uint32_t n_contexts;
    uint32_t queued_requests;
    uint32_t n_connections;
} llms_app_info;

/* Frees an array of n app infos and the array. NULL is fine. */
void llms_app_list_free(llms_app_info *apps, size_t n);

/* Every app: *out gets *n_out infos; free with llms_app_list_free(). */
enum llms_status llms_list_apps(llms_conn *conn, llms_app_info **out, size_t *n_out);

/* Every context of every app (app_name and uid filled); free with llms_context_list_free(). */
enum llms_status llms_list_all_contexts(llms_conn *conn, llms_context_info **out,
                                        size_t *n_out);

/*
 * One context of any app (app_name and uid filled), with its messages when with_history
 * is nonzero. Free *out with llms_context_info_free().
 */
enum llms_status llms_admin_context_get(llms_conn *conn, const char *context_id,
                                        int with_history, llms_context_info *out);

/* Drops a context's KV from memory (it stays persisted and is rebuilt when used). */
enum llms_status llms_evict(llms_conn *conn, const char *context_id);

/* Deletes a context of any app, with its stored history and KV (a damaged one too):
 * FAILED_PRECONDITION while a call runs on it, NOT_FOUND for an unknown id. */
enum llms_status llms_admin_context_delete(llms_conn *conn, const char *context_id);

/* The switch-in cost models, in milliseconds: recomputing t tokens of a context of n
 * costs rec_a + rec_b t + rec_c t n; reading b bytes of chunks out of the page cache
 * costs io_d + io_e b; models has them all (zero from a daemon that does not send it). */
typedef struct llms_profile_result {
    double rec_a, rec_b, rec_c;
    double io_d, io_e;
    llms_cost_models models;
} llms_profile_result;

/* Makes the daemon measure its cost models again (seconds: every point is timed 3 to 7
 * times) and returns them. LLMS_ERR_INTERNAL with the reason when the timings were too
 * noisy to fit (the daemon keeps its models). */
enum llms_status llms_profile(llms_conn *conn, llms_profile_result *out);

/* The prefill memory plan of a prompt of prompt_tokens tokens under the daemon's
 * prefill_budget_mb (admin). text (a line per step, then the budget and partitioning)
 * is the caller's to free(). model: the served model's id, or NULL. */
typedef struct llms_plan_result {
    char *text;
    uint32_t rows;          /* prompt rows per forward step */
    uint32_t attn_rows;     /* query rows per attention score block */
    uint64_t working_bytes;
    uint64_t budget_bytes;  /* 0: no budget */
} llms_plan_result;
enum llms_status llms_plan(llms_conn *conn, uint32_t prompt_tokens, const char *model,
                           llms_plan_result *out);

/* Asks the daemon to shut down cleanly (in-flight calls finish or cancel, state is kept). */
enum llms_status llms_shutdown(llms_conn *conn);

/* One query of a calibration set with its candidate documents. */
typedef struct llms_rerank_query {
    const char *query;
    const char *const *documents;
    size_t n_documents;
} llms_rerank_query;

/* Outcome of llms_rerank_calibrate() (proto RerankCalibrateResponse). */
typedef struct llms_calibration {
    int found;               /* 0: no threshold of the grid reached the precision; the
                                stored threshold is then 0 (no pruning) */
    float cv_threshold;      /* the threshold stored */
    float precision;         /* its mean precision@K over the queries */
    size_t n_grid;
    float *grid;             /* (n_grid) thresholds tried, ascending */
    float *grid_precision;   /* (n_grid) mean precision@K of each */
    double full_ms;          /* mean time per query of the full forward */
    double pruned_ms;        /* mean time per query at the stored threshold */
} llms_calibration;

/* Frees what *c holds (not c itself) and zeroes it. NULL is fine. */
void llms_calibration_free(llms_calibration *c);

/*
 * Calibrates the reranker's pruning threshold: the daemon takes each query's top-K from
 * the full forward, then tries thresholds in ascending order and stores (for its
 * reranker model) the lowest one whose mean precision@K against those reaches
 * precision; later llms_rerank() calls with that target_precision use it. top_k 0: 5.
 * Free *out with llms_calibration_free().
 */
enum llms_status llms_rerank_calibrate(llms_conn *conn, const llms_rerank_query *queries,
                                       size_t n, float precision, uint32_t top_k,
                                       enum llms_rerank_mode mode, llms_calibration *out);

/* ---- knowledge bases and RAG ---- */

/* Creates the app's knowledge base name (1..64 bytes of [A-Za-z0-9._-]); passages of
 * passage_tokens tokens overlapping by overlap_tokens (0: the daemon's defaults).
 * FAILED_PRECONDITION when it exists, RESOURCE_EXHAUSTED past kb_max_per_app. */
enum llms_status llms_kb_create(llms_conn *conn, const char *name, uint32_t passage_tokens,
                                uint32_t overlap_tokens);

/* llms_kb_create; share_uid: the knowledge base's caches (QKV tree) are shared with the
 * other apps of the caller's uid whose knowledge bases are shared too, never with
 * another uid (an app's caches are otherwise its own). */
enum llms_status llms_kb_create_shared(llms_conn *conn, const char *name,
                                       uint32_t passage_tokens, uint32_t overlap_tokens,
                                       int share_uid);

/* Everything a knowledge base is created with (zeroes: the defaults). */
typedef struct llms_kb_options {
    uint32_t passage_tokens, overlap_tokens; /* 0: the daemon's */
    int share_uid;                           /* as llms_kb_create_shared */
    /* The registry's embed model that embeds its passages and queries for the knowledge
     * base's life; NULL: the default embed model (also recorded: a knowledge base never
     * changes model, since its vectors are that model's). NOT_FOUND for a name the daemon
     * does not know, INVALID_ARGUMENT for a model without the embed role. */
    const char *embed_model;
} llms_kb_options;

/* llms_kb_create with options (NULL: the defaults). */
enum llms_status llms_kb_create_opts(llms_conn *conn, const char *name,
                                     const llms_kb_options *options);

/* Deletes a knowledge base with its documents and cached answers. */
enum llms_status llms_kb_drop(llms_conn *conn, const char *name);

/* A document to add: id (replaces a document of that id), text, metadata (may be NULL). */
typedef struct llms_kb_doc {
    const char *id;
    const char *text;
    const char *metadata;
} llms_kb_doc;

/* Adds n documents: they become visible together when the call returns LLMS_OK, and
 * acknowledged means durable; a failed or cancelled add leaves none of them visible.
 * Two of them with one id are LLMS_ERR_INVALID_ARGUMENT.
 * *passages (may be NULL) gets how many passages they made. */
enum llms_status llms_kb_add(llms_conn *conn, const char *kb, const llms_kb_doc *docs, size_t n,
                             uint32_t *passages);

/* Where a KbAdd is: documents cut into passages, passages embedded, passages written
 * (staged: visible only once the add returns). */
enum llms_kb_phase { LLMS_KB_SPLIT = 0, LLMS_KB_EMBED = 1, LLMS_KB_WRITE = 2 };

/* A KbAdd's progress; every count only grows from one report to the next. */
typedef struct llms_kb_progress {
    enum llms_kb_phase phase;
    uint32_t documents, documents_written;  /* in the request; every passage written */
    uint64_t bytes, bytes_split;            /* text bytes in the request; split so far */
    uint32_t passages;                      /* made so far (all of them once embedding) */
    uint32_t passages_embedded, passages_written;
} llms_kb_progress;

/* Called for each progress report; nonzero cancels the add: LLMS_ERR_CANCELLED with
 * nothing of it visible (or LLMS_OK when it had finished before the Cancel came). */
typedef int (*llms_kb_progress_cb)(const llms_kb_progress *p, void *user);

/* llms_kb_add, with on_progress (may be NULL) called while it runs: at most about 4
 * times a second, and once more when every passage is written, before the call
 * returns. */
enum llms_status llms_kb_add_progress(llms_conn *conn, const char *kb, const llms_kb_doc *docs,
                                      size_t n, llms_kb_progress_cb on_progress, void *user,
                                      uint32_t *passages);

/* Removes documents by id; *removed (may be NULL) counts those that existed. */
enum llms_status llms_kb_remove(llms_conn *conn, const char *kb, const char *const *ids,
                                size_t n, uint32_t *removed);

typedef struct llms_kb_info {
    char *name;
    uint32_t documents, passages;
    uint64_t bytes;
    uint32_t passage_tokens, overlap_tokens;
    uint32_t qa_entries;
    int share_uid;              /* made with llms_kb_create_shared(..., 1) */
    char *embed_model;          /* the model that made its vectors ("" when not recorded:
                                   made before llmsd recorded it) */
} llms_kb_info;

void llms_kb_list_free(llms_kb_info *kbs, size_t n);

/* The app's knowledge bases, by name; free with llms_kb_list_free. */
enum llms_status llms_kb_list(llms_conn *conn, llms_kb_info **out, size_t *n_out);

/* How passages are ranked (proto Retrieval). */
enum llms_retrieval {
    LLMS_RETRIEVAL_RRF = 0,    /* hybrid, reciprocal rank fusion (the default) */
    LLMS_RETRIEVAL_SUM = 1,    /* hybrid, sum of min-max normalised scores */
    LLMS_RETRIEVAL_BM25 = 2,
    LLMS_RETRIEVAL_VECTOR = 3,
};

typedef struct llms_kb_hit {
    uint64_t passage;
    char *document;
    uint32_t seq;       /* passage number in its document */
    float score;
    char *text;         /* NULL when not sent */
    char *metadata;     /* NULL when none */
} llms_kb_hit;

void llms_kb_hits_free(llms_kb_hit *hits, size_t n);

/* The top_k (0: the daemon's rag_top_k) passages of kb for query, best first. */
enum llms_status llms_kb_search(llms_conn *conn, const char *kb, const char *query, uint32_t top_k,
                                enum llms_retrieval retrieval, llms_kb_hit **out, size_t *n_out);

typedef struct llms_rag_options {
    uint32_t top_k;               /* 0: the daemon's rag_top_k */
    enum llms_retrieval retrieval;
    const char *system_prompt;    /* NULL: the daemon's rag_system_prompt */
    const llms_params *params;    /* NULL: the daemon's */
    int no_qa;                    /* nonzero: neither answer from nor fill the QA bank */
    int no_qkv;                   /* nonzero: neither reuse nor fill the QKV tree */
    int share_system_uid;         /* nonzero: the system prompt's QKV node is shared with
                                     the other apps of your uid that ask so (never with
                                     another uid); the passages' nodes stay the app's */
} llms_rag_options;

/* How a RagQuery was answered (proto RagOutcome). */
enum llms_rag_outcome { LLMS_RAG_MISS = 0, LLMS_RAG_QA_HIT = 1, LLMS_RAG_QKV_HIT = 2 };

/* "miss", "qa_hit", "qkv_hit". */
const char *llms_rag_outcome_name(enum llms_rag_outcome o);

typedef struct llms_rag_result {
    enum llms_rag_outcome outcome;
    llms_kb_hit *passages;       /* in prompt order */
    size_t n_passages;
    uint32_t prompt_tokens, reused_tokens, reused_passages, generated_tokens;
    double retrieve_ms, prefill_ms, decode_ms, queue_ms;
    enum llms_stop_reason stop_reason;
    float qa_similarity;         /* QA hit: cosine to the stored question */
    char *text;                  /* the whole answer */
} llms_rag_result;

/* Frees what *r holds (not r) and zeroes it. NULL is fine. */
void llms_rag_result_free(llms_rag_result *r);

/* Answers question from knowledge base kb: the answer streams to on_text (may be NULL;
 * nonzero cancels, as in llms_call), out (may be NULL) gets the passages used, the
 * cache outcome and the times. opt may be NULL. */
enum llms_status llms_rag_query(llms_conn *conn, const char *kb, const char *question,
                                const llms_rag_options *opt, llms_token_cb on_text, void *user,
                                llms_rag_result *out);

/* The RAG caches of the caller's app (its own and those its uid shares) and, for an
 * admin, the daemon's counters and idle-time prediction (proto CacheResponse: the
 * meaning of each field is there; the counters are 0 for an app that is not admin). An
 * unbound admin names the caches with llms_cache_stats_of. */
typedef struct llms_cache_stats {
    uint32_t qa_entries, qkv_nodes;
    uint64_t qa_bytes, qkv_bytes, qkv_budget_bytes;
    uint64_t rag_queries, qa_hits, qkv_hits, qkv_tokens_reused, qkv_evictions;
    uint64_t qa_budget_bytes, qa_evictions;
    float tau_query, tau_scheduler;
    uint64_t predicted, predict_prefilled, predict_decoded, predict_preempted;
    uint64_t predict_qa_hits, predict_qkv_hits, predict_generations, predict_steps;
    double predict_ms;
    uint32_t predict_queued;
    uint64_t predict_converted;
    uint64_t predict_warmed;    /* passages prefilled ahead as a prompt's first */
    uint64_t qkv_verify_misses; /* nodes under a query's key that were not its (admin) */
    uint64_t predict_resumed;   /* prediction forwards that went on from where a job
                                   stopped them, instead of starting over */
} llms_cache_stats;

enum llms_status llms_cache_stats_get(llms_conn *conn, llms_cache_stats *out);

/* Which caches an admin names (proto CacheRequest): every owner's (all), or uid's (app
 * NULL: every app of the uid; else that app's and the uid's shared ones). */
typedef struct llms_cache_owner {
    int all;
    uint32_t uid;
    const char *app;
} llms_cache_owner;

/* Admin: llms_cache_stats_get of the caches owner names. */
enum llms_status llms_cache_stats_of(llms_conn *conn, const llms_cache_owner *owner,
                                     llms_cache_stats *out);

/* Admin: sets the daemon's tau_query (QA bank threshold) until it restarts; the cache
 * scheduler follows it. */
enum llms_status llms_cache_tune(llms_conn *conn, float tau_query);

/* Empties the QA banks and QKV trees of the caller's app: its own and those its uid
 * shares. */
enum llms_status llms_cache_clear(llms_conn *conn);

/* Admin: empties the caches owner names. */
enum llms_status llms_cache_clear_of(llms_conn *conn, const llms_cache_owner *owner);

/* ---- workflow graphs ---- */

/*
 * A workflow graph (HedraRAG): generation and retrieval nodes, each setting one state
 * variable, and edges from a node (or "START") to a node (or "END"). After a node runs,
 * its edges are tried in order and the first whose condition ("when") holds is taken;
 * the last edge of each node must have none. Templates put variables in text as {name}
 * ("{{" and "}}" are braces). Conditions: ==, !=, <, <=, >, >= (numbers when both sides
 * read as numbers, else text), contains, and, or, not, parentheses, runs(node),
 * len(variable), steps, 'strings', numbers, true, false. The daemon refuses a malformed
 * graph (INVALID_ARGUMENT) with a message naming the node. Graphs belong to the app and
 * outlive daemon restarts; the built-in templates "one-shot", "hyde", "multistep",
 * "irg" and "recomp" (inputs "question" and "kb") are there for every app.
 */
enum llms_graph_node_kind {
    LLMS_GRAPH_GENERATE = 0,      /* prompt -> generated text */
    LLMS_GRAPH_RETRIEVE = 1,      /* query -> passages of a knowledge base (blank-line joined) */
};

typedef struct llms_graph_node {
    const char *name;             /* 1..64 bytes of [A-Za-z0-9_]; not START or END */
    enum llms_graph_node_kind kind;
    const char *output;           /* the variable it sets */
    const char *prompt;           /* GENERATE: template */
    const llms_params *params;    /* GENERATE: NULL: the daemon's defaults */
    int chat;                     /* GENERATE: nonzero: through the chat template */
    const char *kb;               /* RETRIEVE: knowledge base name (template) */
    const char *query;            /* RETRIEVE: template */
    uint32_t top_k;               /* RETRIEVE: 0: the daemon's rag_top_k */
    enum llms_retrieval retrieval;/* RETRIEVE */
} llms_graph_node;

typedef struct llms_graph_edge {
    const char *from, *to;
    const char *when;             /* NULL: always */
} llms_graph_edge;

typedef struct llms_graph_def {
    const char *const *inputs;    /* variables a run must give */
    size_t n_inputs;
    const llms_graph_node *nodes;
    size_t n_nodes;
    const llms_graph_edge *edges;
    size_t n_edges;
    const char *output;           /* the variable that is a run's answer */
    uint32_t max_steps;           /* node runs per run at most; 0: none (an acyclic graph) */
} llms_graph_def;

/* Creates the app's graph name (1..64 bytes of [A-Za-z0-9._-]). FAILED_PRECONDITION when
 * it exists or is a built-in's name, RESOURCE_EXHAUSTED past graph_max_per_app. */
enum llms_status llms_graph_create(llms_conn *conn, const char *name, const llms_graph_def *def);

/* Deletes the app's graph name (NOT_FOUND when it has none). */
enum llms_status llms_graph_delete(llms_conn *conn, const char *name);

typedef struct llms_graph_info {
    char *name;
    int builtin;
    char **inputs;
    size_t n_inputs;
    size_t n_nodes, n_edges;
    char *output;
    uint32_t max_steps;           /* 0: none */
} llms_graph_info;

void llms_graph_list_free(llms_graph_info *graphs, size_t n);

/* The built-in templates, then the app's graphs by name; free with llms_graph_list_free. */
enum llms_status llms_graph_list(llms_conn *conn, llms_graph_info **out, size_t *n_out);

typedef struct llms_graph_var {
    const char *name, *value;
} llms_graph_var;

enum llms_graph_spec {
    LLMS_GRAPH_SPEC_NONE = 0,     /* none was started */
    LLMS_GRAPH_SPEC_HIT,          /* the final output equalled the provisional one: kept */
    LLMS_GRAPH_SPEC_ROLLBACK,     /* it differed: dropped and redone */
};

/* A node of a running graph started (finished 0) or finished (its variable's value). */
typedef struct llms_graph_event {
    int finished;
    const char *node;
    uint32_t step;                /* 1 for the run's first node */
    const char *output, *value;   /* finished: the variable set and its value */
    double ms;                    /* finished: the node's time */
    uint32_t generated_tokens;    /* finished generation node */
    enum llms_graph_spec speculation; /* finished: what became of the work started on
                                         this node's provisional output */
} llms_graph_event;

/* Called for each node event; nonzero cancels the run. */
typedef int (*llms_graph_event_cb)(const llms_graph_event *ev, void *user);

typedef struct llms_graph_timing {
    char *node;
    uint32_t runs;
    double ms;                    /* over all its runs */
    uint32_t generated_tokens;
} llms_graph_timing;

typedef struct llms_graph_result {
    char *output;                 /* the output variable's value */
    uint32_t steps;               /* node runs */
    int capped;                   /* the step cap stopped it before END */
    llms_graph_timing *timings;   /* the nodes that ran, in graph order */
    size_t n_timings;
    char **state_names, **state_values; /* every variable at the end */
    size_t n_state;
    double total_ms, queue_ms;
    /* Speculation: work started on provisional outputs, kept (hits) and dropped
     * (rollbacks), and how long kept work that had computed something ran before its
     * input was final (an estimate of the time saved). */
    uint32_t speculations, spec_hits, spec_rollbacks;
    double spec_saved_ms;
    /* Prompt tokens of its generation nodes, and those a node took from the KV of the
     * run's previous generation node (graph_reuse_kv) instead of evaluating them. */
    uint32_t prompt_tokens, reused_tokens;
} llms_graph_result;

/* Frees what *r holds (not r) and zeroes it. NULL is fine. */
void llms_graph_result_free(llms_graph_result *r);

/* Runs graph (the app's, or a built-in's name) with n inputs; params (may be NULL) go
 * over every generation node's own. Node events go to on_event (may be NULL); out (may
 * be NULL) gets the result. */
enum llms_status llms_graph_run(llms_conn *conn, const char *graph, const llms_graph_var *inputs,
                                size_t n, const llms_params *params, llms_graph_event_cb on_event,
                                void *user, llms_graph_result *out);

/* Speculation of a run: the daemon's setting (graph_speculate), on or off. */
enum llms_speculate { LLMS_SPECULATE_DEFAULT, LLMS_SPECULATE_ON, LLMS_SPECULATE_OFF };

/* llms_graph_run with speculation chosen: a generation node starts on a retrieval's
 * provisional passages and a retrieval on a generation's first tokens, either redone
 * when the final input differs; greedy answers are the same either way. */
enum llms_status llms_graph_run_speculate(llms_conn *conn, const char *graph,
                                          const llms_graph_var *inputs, size_t n,
                                          const llms_params *params, enum llms_speculate spec,
                                          llms_graph_event_cb on_event, void *user,
                                          llms_graph_result *out);

#ifdef __cplusplus
}
#endif

#endif
