/*
 * http_internal.h — what the gateway's files share: http.c (routes, identity,
 * connections and bodies, requests in flight, streaming, setup), openai.c (the JSON of
 * the OpenAI API: request bodies read into native requests, native answers written as
 * OpenAI's objects and Server-Sent Events), responses.c (OpenAI's Responses API on the
 * chat route's machinery), ollama.c (ollama's API: its JSON and NDJSON streams),
 * llamacpp.c (llama.cpp's server's own API) and tokroute.c. Not for any other file.
 */
#ifndef LLMS_HTTP_INTERNAL_H
#define LLMS_HTTP_INTERNAL_H

#include <event2/buffer.h>
#include <json-c/json.h>

#include "daemon/net/connbudget.h"
#include "daemon/net/http.h"
#include "daemon/net/httpwire.h"
#include "daemon/net/reasoning.h"
#include "daemon/net/respstore.h"
#include "daemon/net/session.h"
#include "daemon/net/toolcall.h"
#include "daemon/net/uidtab.h"

#define HREQ_BUCKETS 256
#define MAX_COUNTS 64           /* (route, status) pairs /metrics counts */

enum route {
    R_MODELS,
    R_CHAT,
    R_COMPLETIONS,
    R_EMBEDDINGS,
    R_RERANK,
    R_RAG,
    R_RESPONSES,               /* OpenAI's Responses API (responses.c) */
    R_RESPONSE,                /* GET and DELETE /v1/responses/{id}: a stored response */
    R_RESPONSE_ITEMS,          /* GET /v1/responses/{id}/input_items */
    R_TOKENIZE,
    R_DETOKENIZE,
    R_HEALTH,
    R_ROOT,                    /* "/": a heartbeat, as ollama answers it (its CLI probes it) */
    R_METRICS,
    /* ollama's routes (ollama.c), R_OLLAMA_VERSION to R_OLLAMA_MANAGE */
    R_OLLAMA_VERSION,
    R_OLLAMA_TAGS,
    R_OLLAMA_PS,
    R_OLLAMA_SHOW,
    R_OLLAMA_GENERATE,
    R_OLLAMA_CHAT,
    R_OLLAMA_EMBED,
    R_OLLAMA_EMBEDDINGS,
    R_OLLAMA_MANAGE,           /* pull, push, create, copy, delete: refused */
    /* llama.cpp's server's own routes (llamacpp.c), R_LLAMACPP_COMPLETION to
     * R_LLAMACPP_SLOTS_ACTION */
    R_LLAMACPP_COMPLETION,     /* /completion, and its alias /completions */
    R_LLAMACPP_INFILL,
    R_LLAMACPP_PROPS,
    R_LLAMACPP_EMBEDDING,      /* /embedding, and its alias /embeddings */
    R_LLAMACPP_APPLY_TEMPLATE,
    R_LLAMACPP_LORA_ADAPTERS,  /* GET /lora-adapters; POST (global scales) refused */
    R_LLAMACPP_SLOTS,          /* GET /slots: refused */
    R_LLAMACPP_SLOTS_ACTION,   /* POST /slots/{id_slot}?action=...: refused */
    R_OTHER,
};

/* Whether r is one of ollama's routes, answered in ollama's shapes. */
static inline bool http_route_is_ollama(enum route r)
{
    return r >= R_OLLAMA_VERSION && r <= R_OLLAMA_MANAGE;
}

/* Whether r is one of llama.cpp's own routes, answered in its server's shapes. */
static inline bool http_route_is_llamacpp(enum route r)
{
    return r >= R_LLAMACPP_COMPLETION && r <= R_LLAMACPP_SLOTS_ACTION;
}

typedef struct token_entry token_entry;
typedef struct gwconn gwconn;

/* Choices one generation request may ask for (OpenAI's "n"): each is a native request of
 * its own, queued and admitted as one more request of the app. */
#define HTTP_CHOICES_MAX 16

/* One choice of a generation: what of it has been streamed, and its final reply. */
typedef struct gen_choice {
    size_t sent;               /* bytes of its text already streamed */
    json_object *lp;           /* logprobs received and not yet sent in an SSE event */
    size_t lp_seen;            /* tokens whose logprobs came in streamed chunks */
    size_t lp_chars;           /* characters of its text before the next token (a
                                  completion's text_offset) */
    Llms__Response *result;    /* its final reply, kept until every choice has one; NULL
                                  while it runs */
    reasoning_split split;     /* (hreq.reasoning) its reasoning told apart as it streams */
} gen_choice;

typedef struct hreq {
    http *h;
    httpwire_conn *wc;
    gwconn *gc;
    session ss;
    enum route route;
    json_object *body;         /* the parsed request, kept for the texts it holds */
    bool stream, include_usage, base64, return_documents;
    bool tei;                  /* a rerank in TEI's form ("texts"), answered in its shape */
    uint32_t dimensions;       /* an embedding request's "dimensions", or 0: none asked */
    bool started;              /* the SSE reply (headers and chunks) has begun */
    bool done;                 /* answered (or gone): only freeing is left */
    bool cancel_sent;          /* the client reads too slowly: generation cancelled */
    const char *context_id;    /* "llmsd": {"context": ...}, or NULL */
    const char *model_named;   /* the body's "model", or NULL: the route's default */
    char model[MODELS_NAME_MAX + 1]; /* the model the reply names */
    enum chat_family family;   /* its chat template (a chat is rendered with it) */
    char *prefix;              /* the start of every SSE chunk, up to its choice's index
                                  ("data: {...,\"choices\":[{\"index\":") */
    Llms__TokenBias *bias;     /* (n_bias) the body's logit_bias, for the request's params */
    Llms__TokenBias **bias_ptrs; /* (n_bias) pointers to them, as protobuf-c wants */
    bool logprobs;             /* the body asked for them */
    unsigned n_choices;        /* the body's "n" (1 for every other route) */
    unsigned n_ended;          /* choices whose final reply came */
    gen_choice choices[HTTP_CHOICES_MAX];
    bool no_thinking;          /* chat_template_kwargs.enable_thinking false (ollama's think
                                  false): rendered with the template's switch off */
    bool reasoning;            /* a chat's reply on a thinking model: its reasoning told
                                  apart from its content (reasoning.h) */
    const char *effort;        /* gpt-oss's reasoning effort (into body), NULL: medium */
    char *whole_split;         /* a whole gpt-oss reply's reasoning and content
                                  (openai_split_whole), or NULL */
    toolcall_set tools;        /* a chat's tools (tools.n == 0: none) */
    toolcall_scan *scan;       /* the reply read for calls (tool_choice "auto"; n is 1),
                                  or NULL */
    struct llamacpp_req *lc;   /* a llama.cpp /completion's or /infill's own state
                                  (llamacpp.c; llamacpp_req_free), or NULL */
    struct responses_req *rs;  /* a /v1/responses request's own state (responses.c), or
                                  NULL */
    struct evbuffer *sse;
    char id[48];
    int64_t created;
    struct hreq *next;
} hreq;

typedef struct count {
    enum route route;
    int status;
    uint64_t n;
} count;

struct http {
    struct event_base *base;
    const config *cfg;
    session_env senv;
    models *reg;               /* only models_view_update: the worker owns the rest */
    models_view view;          /* the registry's names, roles and templates, brought up to
                                  date at each request */
    connbudget *budget;        /* counts the connections with the native ones */
    httpwire *wire;
    bool owns_path;
    token_entry *tokens;
    size_t n_tokens;
    bool have_admin_gid;
    gid_t admin_gid;
    uint64_t next_id;
    bool shutting, worker_done;
    unsigned n_reqs;
    hreq *buckets[HREQ_BUCKETS];
    unsigned n_conns;          /* HTTP connections open */
    unsigned n_unauth;         /* ... of them on TCP with no valid token yet */
    size_t body_bytes;         /* bodies being received, every uid together */
    uidtab body_bytes_per_uid; /* the same per uid */
    /* /metrics */
    count counts[MAX_COUNTS];
    size_t n_counts;
    uint64_t prompt_tokens, completion_tokens, embed_tokens, cancelled;
    uint64_t cached_tokens;  /* of prompt_tokens, those resumed from the prompt cache */
    respstore *store;          /* owned: the Responses API's stored responses */
};

/* ---- http.c: answering, requests in flight, the registry's view ---- */

/* o as compact JSON text, owned by o. */
const char *http_json_text(json_object *o);

/* Ends hr with a native error in the shape of its route's API (openai_finish_error,
 * ollama_finish_error or llamacpp_finish_error). */
void http_finish_error(hreq *hr, Llms__ErrorCode code, const char *msg);

/* Counts one answer of route r with status for /metrics. */
void http_count_status(http *h, enum route r, int status);

/* Sends o (taken; NULL: out of memory, answered 500) as a JSON reply, counted. */
void http_send_json(http *h, httpwire_conn *wc, enum route r, int status, json_object *o);

/* Ends hr towards the worker (its native connection closes, cancelling what still runs)
 * and the loop; the caller then answers it. Idempotent. */
void http_req_finish(hreq *hr);

/* Hands r to session_handle as hr's native request. -1 when it could not be built, after
 * answering hr. */
int http_submit(hreq *hr, const Llms__Request *r);

/* The model a request of role runs on when it names none; NULL when no model has it. */
const models_view_entry *http_view_default(const http *h, unsigned role);

/* An embedding as a JSON array of numbers (NULL out of memory). */
json_object *http_vector_json(const Llms__Vector *v);

/* Whether e's vectors are of another length than hr's "dimensions" asked for (msg says
 * so): a model's vectors have one length, which only it knows, and ones of another
 * length would pass for those asked for. */
bool http_embed_dimensions_differ(const hreq *hr, const Llms__EmbedResponse *e, char *msg,
                                  size_t cap);

/* ---- openai.c: OpenAI's shapes ---- */

/* The HTTP status, OpenAI error type and code of a native error. */
void openai_map_error(Llms__ErrorCode c, int *status, const char **type, const char **code);

/* OpenAI's finish_reason: "stop" and "length" where they apply; the reasons OpenAI has
 * no word for keep llmsd's name rather than pass for a normal end. */
const char *openai_finish_reason(Llms__StopReason r);

/* The chat's messages (a JSON array of {role, content}) rendered with a model's template
 * and the assistant opening (its enable_thinking off with hr->no_thinking); with hr's
 * tools (toolcall.h) when it has some, and then hr->scan made when replies are read for
 * calls. Fresh string, or NULL with msg. */
char *openai_render_chat(hreq *hr, json_object *msgs, char *msg, size_t cap);

/* A chat body's "chat_template_kwargs" ({"enable_thinking": bool}, vLLM's and
 * llama.cpp's, and {"reasoning_effort": ...}; other keys, which only other templates
 * read, are read past), OpenAI's "reasoning_effort" and llama.cpp's "reasoning_format"
 * ("auto" or "deepseek": reasoning apart, "none": left in the text; absent: the daemon's
 * setting) into hr->no_thinking, hr->effort (gpt-oss's: "low", "medium" or "high"; other
 * templates have none and read past it) and hr->reasoning (for a model whose template has
 * the think markers, or gpt-oss). 0, or -1 with msg. */
int openai_read_thinking(hreq *hr, char *msg, size_t cap);

/* Starts the split of each of hr's choices (when hr->reasoning), once its tools are read:
 * a forced call's reply is the call, split by nothing. */
void openai_split_start(hreq *hr);

/* A whole reply told apart as hr asks: *reasoning (none unless hr->reasoning) and
 * *content, runs of text (for gpt-oss in hr->whole_split, its calls in chatml's syntax
 * for hr's scan). -1 out of memory. */
int openai_split_whole(hreq *hr, const char *text, reasoning_span *reasoning,
                       reasoning_span *content);

/* A chat body's "messages" into *msgs (owned by body): 0, or -1 with msg when they are no
 * non-empty array. */
int openai_chat_messages(json_object *body, json_object **msgs, char *msg, size_t cap);

/* Answers status with OpenAI's error object {"error": {message, type, param, code}}. */
void openai_send_error(http *h, httpwire_conn *wc, enum route r, int status,
                       const char *type, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

/* The reply's format of a generation's body into p: OpenAI's response_format
 * ({"type": "text"} or null: free text, "json_object": JSON mode, "json_schema" with
 * {"json_schema": {"schema": {...}}}: JSON mode following the schema, its name,
 * description and strict read past as the schema is always enforced; llama.cpp's
 * {"type": "json_object", "schema": {...}} too), or llama.cpp's top-level "json_schema"
 * (a schema object) or "grammar" (GBNF text; "" or null is none): one of them at most.
 * The schema's or grammar's text lives in body; the session refuses one the engine cannot
 * enforce. 0, or -1 with msg. */
int openai_read_format(json_object *body, Llms__GenerationParams *p, char *msg, size_t cap);

/* Appends n bytes of text to b as the inside of a JSON string: streamed text is escaped
 * so rather than through json-c, which would build and free an object per token. */
void openai_add_escaped(struct evbuffer *b, const char *s, size_t n);

/* The "llmsd" object of a generation whose choices have all ended (their results kept in
 * hr->choices): why each stopped and the times of the whole. NULL out of memory. */
json_object *openai_llmsd_obj(const hreq *hr);

/* A logit_bias key as a token id (decimal, 0..INT32_MAX) into *id; false when it is
 * none. */
bool openai_token_id(const char *key, int32_t *id);

/* A token's bytes as a JSON array of numbers (logprobs' "bytes"). */
json_object *openai_piece_bytes(const ProtobufCBinaryData *piece);

/* A token's text as a JSON string (its first 256 bytes): bytes that are no character at
 * all as U+FFFD, since JSON text is UTF-8, and a character cut at its end as U+FFFD too
 * when cut_end_kept (OpenAI's), else left out (llama.cpp's: a byte token alone is "");
 * the "bytes" beside it give them as they are. */
json_object *openai_piece_text(const ProtobufCBinaryData *piece, bool cut_end_kept);

/* Answers 400 invalid_request with msg. */
void openai_bad_request(http *h, httpwire_conn *wc, enum route r, const char *msg);

/* Ends hr with a native error: an error reply, or once the stream has begun its last
 * event. */
void openai_finish_error(hreq *hr, Llms__ErrorCode code, const char *msg);

/* Begins hr's SSE reply (headers; for a chat the assistant role of each choice). 0, or -1
 * out of memory. */
int openai_sse_start(hreq *hr);

/* Streams n bytes of text of choice i as one SSE chunk of hr, with the logprobs the
 * choice holds (taken); finish: NULL, or the finish_reason that ends the choice. */
void openai_sse_text(hreq *hr, unsigned i, const char *text, size_t n, const char *finish);

/* Adds the logprobs of n more tokens to those choice i holds for its next SSE event
 * (nothing when the body asked for none). */
void openai_logprobs_add(hreq *hr, unsigned i, Llms__TokenLogprob *const *lps, size_t n);

/* Streams a piece of choice i's reply: as openai_sse_text, or through hr's scan for
 * tool calls (content as it is decided, each call as a tool_calls delta once whole). */
void openai_sse_piece(hreq *hr, unsigned i, const char *text, size_t n);

/* The final reply of choice i of a completion or chat turn (r, a Response with a result,
 * taken): kept, and streamed at once when hr streams; the last choice's ends hr with
 * the answer of them all. */
void openai_on_result(hreq *hr, unsigned i, Llms__Response *r);

/* hr's final answer from the worker's native reply: a RAG answer, embeddings, rerank
 * scores. Each ends hr. */
void openai_on_rag_result(hreq *hr, const Llms__RagResult *res);
void openai_on_embed(hreq *hr, const Llms__EmbedResponse *e);
void openai_on_rerank(hreq *hr, const Llms__RerankResponse *rr);

/* Reads hr's body into the native request r of its route (msg, cap: room for a refusal)
 * and submits it; a body that does not fit is answered 400 instead. Either way hr->done
 * tells whether hr is over. */
void openai_start_generate(hreq *hr, Llms__Request *r, char *msg, size_t cap);
void openai_start_rag(hreq *hr, Llms__Request *r, char *msg, size_t cap);
void openai_start_embed(hreq *hr, Llms__Request *r, char *msg, size_t cap);
void openai_start_rerank(hreq *hr, Llms__Request *r, char *msg, size_t cap);

/* Submits hr's native Embed of in's texts (a string or a non-empty array of strings) on
 * hr's model, which field of the body held: what openai_start_embed sends, for the other
 * APIs' embedding routes too. A refusal (400 naming field) is in the shape of hr's route,
 * and ends hr. */
void openai_submit_embed(hreq *hr, Llms__Request *r, json_object *in, const char *field,
                         char *msg, size_t cap);

/* ---- responses.c: OpenAI's Responses API ---- */

/* A Responses body (POST /v1/responses) as the chat completion body it asks for, fresh in
 * *chat: the items of prior (a stored conversation's, or NULL: none), then input, and
 * instructions as messages (function_call and function_call_output
 * items as assistant tool_calls and tool messages), the flat function tools and
 * tool_choice in the chat's shape, text.format as response_format, max_output_tokens as
 * max_tokens, the chat's sampling fields as they are. 0; -1 with msg naming the field for
 * what cannot be served (a stored response or conversation, a hosted tool, an image);
 * -2 out of memory. */
int responses_chat_body(json_object *req, json_object *prior, json_object **chat, char *msg,
                        size_t cap);

/* Answers route r (R_RESPONSE: GET, or DELETE when del; R_RESPONSE_ITEMS) for uid from
 * h's store: uri (its path plen bytes, then the query) names the response. */
void responses_send_stored(http *h, httpwire_conn *wc, enum route r, const char *uri,
                           size_t plen, bool del, uid_t uid);

/* As openai_start_generate, for /v1/responses: hr's body read as responses_chat_body
 * turns it into a chat, which runs as /v1/chat/completions runs it. */
void responses_start(hreq *hr, Llms__Request *r, char *msg, size_t cap);

/* Begins hr's event stream (headers, response.created, response.in_progress). 0, or -1
 * out of memory. */
int responses_sse_start(hreq *hr);

/* Streams a piece of the reply: text deltas of its message item, or through hr's scan for
 * tool calls, each call as a function_call item once whole. */
void responses_sse_piece(hreq *hr, const char *text, size_t n);

/* hr's final reply (r, a Response with a result, taken): the response object, or the end
 * of its stream. Ends hr. */
void responses_on_result(hreq *hr, Llms__Response *r);

/* As openai_finish_error; once the stream has begun its last event is response.failed,
 * and the failed response is stored (unless store is false). */
void responses_finish_error(hreq *hr, Llms__ErrorCode code, const char *msg);

/* hr's client left before its result: a stream that has begun is stored (unless store is
 * false) as an incomplete response ("cancelled") with the items it streamed. */
void responses_gone(hreq *hr);

/* Frees hr->rs (NULL: nothing). */
void responses_req_free(struct responses_req *rs);

/* ---- ollama.c: ollama's shapes ---- */

/* Answers status with ollama's error object {"error": msg}. */
void ollama_send_error(http *h, httpwire_conn *wc, enum route r, int status, const char *msg);

/* As openai_finish_error, in ollama's shapes (once the stream has begun, its last line is
 * {"error": msg}). */
void ollama_finish_error(hreq *hr, Llms__ErrorCode code, const char *msg);

/* As request_model in http.c for ollama's route r: the model the body's "model" (or
 * "name") names, "NAME:latest" standing for NAME, else the route's default. 0, or -1
 * after answering 404 {"error": "model 'x' not found"} (or 400 when /api/show names
 * none). */
int ollama_request_model(http *h, httpwire_conn *wc, enum route r, json_object *body,
                         const char **named, const models_view_entry **e);

/* Answers GET /api/version, /api/tags or /api/ps (r) from h's view of the registry. */
void ollama_send_info(http *h, httpwire_conn *wc, enum route r);

/* Answers POST /api/show of model e (ollama_request_model found it: never NULL). */
void ollama_send_show(http *h, httpwire_conn *wc, const models_view_entry *e);

/* Answers /api/pull, /api/push, /api/create, /api/copy or /api/delete: refused. */
void ollama_refuse_manage(http *h, httpwire_conn *wc);

/* As openai_start_generate for /api/generate and /api/chat, and openai_start_embed for
 * /api/embed and /api/embeddings. */
void ollama_start_generate(hreq *hr, Llms__Request *r, char *msg, size_t cap);
void ollama_start_embed(hreq *hr, Llms__Request *r, char *msg, size_t cap);

/* Begins hr's NDJSON reply (headers; its lines go out as they come). */
void ollama_stream_start(hreq *hr);

/* Streams n bytes of text as one line of hr (through hr's scan for tool calls, when it
 * has one: a call goes out in the line where it closes). */
void ollama_stream_text(hreq *hr, const char *text, size_t n);

/* hr's final answer from the worker's native reply; each ends hr. */
void ollama_on_result(hreq *hr, const Llms__CallResult *res);
void ollama_on_embed(hreq *hr, const Llms__EmbedResponse *e);

/* ---- llamacpp.c: llama.cpp's server's own shapes ---- */

/* Answers status with llama.cpp's error object {"error": {"code", "message", "type"}}. */
void llamacpp_send_error(http *h, httpwire_conn *wc, enum route r, int status, const char *msg);

/* As openai_finish_error, in llama.cpp's shapes (once the stream has begun, it ends with
 * an "error: {...}" line, as llama.cpp's server ends one). */
void llamacpp_finish_error(hreq *hr, Llms__ErrorCode code, const char *msg);

/* Answers GET /props from h's settings and view of the registry. */
void llamacpp_send_props(http *h, httpwire_conn *wc);

/* Answers POST /props: refused, as llama.cpp's server refuses it without --props. */
void llamacpp_refuse_props_change(http *h, httpwire_conn *wc);

/* Answers GET /slots or POST /slots/{id_slot} (r): refused, as llama.cpp's server refuses
 * them without --slots and --slot-save-path. */
void llamacpp_refuse_slots(http *h, httpwire_conn *wc, enum route r);

/* llama.cpp's LoRA adapters of the default generate model, by id: here the adapter files
 * of the adapter models over it (daemon/models/models.h), each once, in registry order.
 * fn(arg, id, path) for each until it returns false; returns how many there are. */
int llamacpp_lora_each(const http *h, bool (*fn)(void *arg, int id, const char *path),
                       void *arg);

/* GET /lora-adapters: [{"id", "path", "scale"}] as llama-server lists its adapters, the
 * scale a request without "lora" applies on the default generate model (0: a set of
 * adapters is a model of its own), and in "llmsd" the adapter models applying it. */
void llamacpp_send_lora_adapters(http *h, httpwire_conn *wc);

/* POST /lora-adapters (llama-server's global scales): refused 501. */
void llamacpp_refuse_lora_change(http *h, httpwire_conn *wc);

/* As openai_start_generate, for /completion. */
void llamacpp_start_completion(hreq *hr, Llms__Request *r, char *msg, size_t cap);

/* As openai_start_generate, for /infill: the fill-in-the-middle prompt (daemon/infill.h)
 * of the default generate model, whose tokenizer the gateway holds, as a Complete of its
 * token ids; a model without the FIM tokens is refused 501, as llama.cpp's server refuses
 * it. */
void llamacpp_start_infill(hreq *hr, Llms__Request *r, char *msg, size_t cap);

/* Frees hr->lc (NULL is fine). */
void llamacpp_req_free(struct llamacpp_req *lc);

/* Answers POST /apply-template: hr's messages and tools rendered into the prompt
 * /v1/chat/completions would evaluate for them on hr's model. Ends hr. */
void llamacpp_apply_template(hreq *hr, char *msg, size_t cap);

/* As openai_start_embed, for /embedding (and /embeddings). */
void llamacpp_start_embedding(hreq *hr, Llms__Request *r, char *msg, size_t cap);

/* Begins hr's SSE reply (headers; its events go out as they come). */
void llamacpp_stream_start(hreq *hr);

/* Streams a chunk of the reply as one event of hr. */
void llamacpp_stream_chunk(hreq *hr, const Llms__CallChunk *ch);

/* hr's final answer from the native reply: a completion, embeddings. Each ends hr. */
void llamacpp_on_result(hreq *hr, const Llms__CallResult *res);
void llamacpp_on_embedding(hreq *hr, const Llms__EmbedResponse *e);

/* ---- tokroute.c: /tokenize and /detokenize (llama.cpp's server's shape) ---- */

/* As openai_start_generate, for hr's route R_TOKENIZE or R_DETOKENIZE. */
void tokroute_start(hreq *hr, Llms__Request *r, char *msg, size_t cap);

/* hr's answer from the native Tokenize or Detokenize reply; each ends hr. */
void tokroute_on_tokenize(hreq *hr, const Llms__TokenizeResponse *t);
void tokroute_on_detokenize(hreq *hr, const Llms__DetokenizeResponse *d);

/* Answers GET /v1/models (id NULL) or GET /v1/models/{id} (id_len bytes) from h's view
 * of the registry. */
void openai_send_models(http *h, httpwire_conn *wc, const char *id, size_t id_len);

#endif
