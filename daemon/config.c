/*
 * config.c — llmsd's settings table and everything made from it: the defaults, the file
 * parser and the flags, --help, and the documentation (the table of daemon/README.md and
 * the sample systemd/llmsd.conf), so that a setting is described in one place.
 */
#include "daemon/config.h"
#include "daemon/reqlog.h"
#include "engine/cuda/cuda.h"
#include "engine/tok/chat.h"

#include <ctype.h>
#include <stdbool.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* KEY_OPTIONAL: a string setting that may be off, written "none". KEY_HEADING: not a key
 * but the title of the group of keys after it in the documentation. */
enum key_type {
    KEY_STRING,
    KEY_OPTIONAL,
    KEY_INT,
    KEY_U32,
    KEY_FLOAT,
    KEY_MODE,
    KEY_CHOICE,
    KEY_HEADING
};

typedef struct key_def {
    const char *name;
    enum key_type type;
    size_t offset;
    size_t size;         /* KEY_STRING, KEY_OPTIONAL, KEY_CHOICE: capacity of the field */
    double min, max;     /* numeric range, inclusive */
    const char *choices; /* KEY_CHOICE: the allowed values, '|'-separated */
    const char *def;     /* the default, written as in the file and set by config_set, so
                            that it passes the same checks; NULL: none, the field starts
                            empty (only for keys whose emptiness means something) */
    const char *example; /* a key without a default: its value in the sample llmsd.conf */
    /* Plain text with `code` spans (KEY_HEADING: the title): the Markdown keeps the
     * backquotes, --help and the sample llmsd.conf drop them. */
    const char *help;
} key_def;

#define KEY(f) .name = #f, .offset = offsetof(config, f)
#define SIZE(f) .size = sizeof((config *)0)->f
#define STR(f, d, h) {KEY(f), SIZE(f), .type = KEY_STRING, .def = d, .help = h}
#define NODEF(f, ex, h) {KEY(f), SIZE(f), .type = KEY_STRING, .example = ex, .help = h}
#define OPT(f, h) {KEY(f), SIZE(f), .type = KEY_OPTIONAL, .def = "none", .help = h}
#define CHOICE(f, c, d, h) {KEY(f), SIZE(f), .type = KEY_CHOICE, .choices = c, .def = d, .help = h}
#define INT(f, lo, hi, d, h) {KEY(f), .type = KEY_INT, .min = lo, .max = hi, .def = d, .help = h}
#define FLT(f, lo, hi, d, h) {KEY(f), .type = KEY_FLOAT, .min = lo, .max = hi, .def = d, .help = h}
#define HEADING(title) {.type = KEY_HEADING, .help = title}

/* In the order of the documentation. */
static const key_def keys[] = {
    HEADING("The daemon"),
    NODEF(model, "/var/lib/llmsd/model.gguf",
          "the default generate model's GGUF file (a llama, qwen2, qwen3, phi3, granite, "
          "qwen2moe, qwen3moe, olmoe, gemma, gemma2, gemma3, olmo2, granitemoe, smollm3, "
          "exaone, exaone4, stablelm, mistral3, glm4, chatglm, command-r, cohere2, "
          "starcoder2, phi2, seed_oss, hunyuan-dense, internlm2, ernie4_5, xverse, deepseek2, "
          "ernie4_5-moe, glm4moe or gpt-oss model, Mixtral's "
          "llama with experts too, or the language model of a qwen2vl, qwen3vl or qwen3vlmoe "
          "conversion, text only), required "
          "unless a `model.NAME` line has the `generate` role; its registry "
          "name is the file name without `.gguf`. The service runs with `ProtectHome=yes`: "
          "keep it outside /home (e.g. in /var/lib/llmsd or /usr/local/share)"),
    CHOICE(chat_template,
           "auto|" CHAT_FAMILY_NAMES, "auto",
           "the chat template of the default generate model (`model`): `auto` recognises "
           "the file's `tokenizer.chat_template` (a template llmsd does not know gives "
           "`plain`, \"User: ...\\nAssistant:\"), or a family by name, as llama.cpp's "
           "`--chat-template` names them (and `hermes`: chatml with Hermes 2 Pro's and 3's "
           "tool format; `qwen3` and `qwen3-thinking`: chatml as Qwen3's template writes "
           "it, earlier replies without their reasoning, the second opening the model's "
           "reasoning itself; `gpt-oss`: OpenAI's harmony format; `glm-4.7`: GLM-4.7's and "
           "GLM-4.7-Flash's template, the generation prompt opening the model's reasoning; "
           "`glm-4.5`: GLM-4.5's, 4.5-Air's and 4.6's template; `ernie4_5`: ERNIE 4.5's), "
           "for a file without a "
           "template or with a wrong one"),
    CHOICE(model_load, "map|copy", "map",
           "how the weights come into memory: `map` maps the file (pages shared with the page "
           "cache, reclaimable under memory pressure); `copy` reads them into private memory "
           "on huge pages (fewer TLB misses as decode streams them: Q8_0 decode about 5% "
           "faster with 2 threads, up to 18% on one; never reclaimed)"),
    STR(socket, "/run/llmsd/llmsd.sock",
        "Unix socket the daemon listens on (ignored when systemd passes one, as llmsd.socket "
        "does)"),
    {KEY(socket_mode), .type = KEY_MODE, .min = 0, .max = 0777, .def = "0660",
     .help = "permission bits of the socket file, octal; its group is the daemon's"},
    STR(admin_group, "llms-admin",
        "group whose members may make admin calls (`llmsctl`); root always may"),
    CHOICE(log_level, REQLOG_LEVELS, "info",
           "what goes to stderr (the journal): `error` (failures of the daemon itself), "
           "`warn`, or `info`: also one line per request that used the engine "
           "(`app=UID/NAME kind=call tokens=N ms=T outcome=STOP_EOS`) and one per error "
           "answered"),
    STR(state_dir, "/var/lib/llmsd",
        "state directory: the catalog of apps and contexts (sqlite3, `llmsd.db`) and their "
        "data"),
    INT(threads, 0, 1024, "0", "engine threads, 0 = online cores"),
    STR(device, "cpu",
        "where generate models run: `cpu`, or `cuda` / `cuda:N` for GPU N (an llmsd built "
        "with `make CUDA=1`; llama, qwen2 and qwen3 models in F32, F16, BF16, Q8_0, Q4_0, "
        "Q4_K, Q5_K or Q6_K). Weights are uploaded once; contexts keep their K/V on the GPU "
        "while they run and in host memory as always, so that they are stored and swapped "
        "as on the CPU. A model the GPU cannot run, or a missing GPU, is logged and the "
        "model stays on the CPU. The shipped unit's `PrivateDevices=yes` hides the GPU: "
        "systemd/README.md has the drop-in that allows it"),
    INT(n_ctx, 0, 1 << 24, "0",
        "tokens per context window; 0 = the model's trained length or 4096, whichever is "
        "smaller; more than the trained length starts with a warning (past it the model "
        "has seen no positions)"),

    HEADING("Per-app limits (an app is a peer uid and the name it binds with)"),
    INT(max_contexts_per_app, 1, INT_MAX, "64",
        "contexts an app may keep, damaged ones included (kept as they are until deleted); "
        "creating one more answers `RESOURCE_EXHAUSTED`, saying how many are damaged"),
    INT(max_tokens_per_context, 0, 1 << 24, "0",
        "tokens per context (its window), 0 (or more than `n_ctx`) = `n_ctx`; what a call "
        "that would pass it does is the context's `overflow` policy"),
    CHOICE(overflow, "window|refuse", "window",
           "what a context created without its own policy does when a call fills its window: "
           "`window` (slide: keep the first tokens and the most recent, drop the middle from "
           "the model's view, go on) or `refuse` (stop the reply with `STOP_CONTEXT_FULL`; "
           "later calls `FAILED_PRECONDITION`)"),
    INT(window_sink, 4, 1 << 24, "4",
        "tokens a sliding window keeps at the start of a context, at least; rounded up to "
        "16-token chunks, and a system prompt is kept whole (up to half the window)"),
    INT(max_queued_per_app, 1, INT_MAX, "16",
        "requests of every kind that use the engine (Call, Complete, Embed, Rerank, "
        "RerankCalibrate, RagQuery, GraphRun, KbAdd, KbDrop) an app may have queued or "
        "running; more answer `RESOURCE_EXHAUSTED`"),

    HEADING("Per-uid limits (every app name of one peer uid together)"),
    INT(max_contexts_per_uid, 1, INT_MAX, "1024",
        "contexts one uid may keep over all its app names"),
    INT(max_queued_per_uid, 1, INT_MAX, "32",
        "engine requests one uid may have queued or running over all its app names"),
    INT(max_apps_per_uid, 1, INT_MAX, "16",
        "app names one uid may have bound at once (a Bind of one more: "
        "`RESOURCE_EXHAUSTED`)"),

    HEADING("Connections"),
    INT(max_connections, 1, INT_MAX, "1024",
        "connections open at once, every peer together, the HTTP gateway's counted with the "
        "native ones (lowered, with a warning, to the open-file limit less 64 descriptors "
        "kept for the daemon: see `LimitNOFILE` in llmsd.service); one more is answered "
        "`RESOURCE_EXHAUSTED` (HTTP: 503) and closed"),
    INT(max_connections_per_uid, 1, INT_MAX, "64",
        "connections one peer uid may hold open, native and HTTP together (on TCP the uid "
        "of the token, once a request has named one); one more is answered "
        "`RESOURCE_EXHAUSTED` (HTTP: 429) and closed"),
    INT(bind_timeout_ms, 1, INT_MAX, "5000",
        "a connection that has not sent Bind by then gets `DEADLINE_EXCEEDED` and is closed"),
    INT(idle_timeout_ms, 0, INT_MAX, "3600000",
        "a bound connection with no request in flight and no traffic for this long gets "
        "`DEADLINE_EXCEEDED` and is closed; 0 = never"),

    HEADING("Frames and the input a client can make the daemon hold"),
    {KEY(max_frame_bytes), .type = KEY_U32, .min = 1024, .max = (double)UINT32_MAX,
     .def = "16777216",
     .help = "largest frame (4-byte length + protobuf message) accepted or sent, at least "
             "1024; a bigger request is refused with an error and the connection closes; a "
             "Call or Complete whose logprobs may not fit a reply is refused before it runs "
             "(`INVALID_ARGUMENT`, saying how many tokens fit)"},
    INT(max_unbound_frame_bytes, 64, INT_MAX, "4096",
        "largest frame before Bind (a Bind is a few dozen bytes); a larger one is refused "
        "from its header"),
    INT(max_buffered_bytes, 0, INT_MAX, "67108864",
        "bytes of partly received frames over 64 KiB the daemon holds for all connections "
        "together; a frame that would pass it is refused from its header "
        "(`RESOURCE_EXHAUSTED`)"),
    INT(max_buffered_bytes_per_uid, 0, INT_MAX, "17825792",
        "the same for the connections of one peer uid together (one frame of the default "
        "`max_frame_bytes` at a time), so that no uid can spend the whole "
        "`max_buffered_bytes`"),
    INT(frame_body_timeout_ms, 1, INT_MAX, "10000",
        "a frame over 64 KiB must arrive whole within this long of its header plus 1 s a "
        "MiB, else the connection gets `DEADLINE_EXCEEDED` and is closed (a header alone "
        "does not hold memory for long)"),
    INT(max_text_bytes, 1, INT_MAX, "65536",
        "bytes of a prompt, system prompt, text to embed or Tokenize input (more: "
        "`INVALID_ARGUMENT` naming the field)"),

    HEADING("Scheduling and memory"),
    INT(step_tokens, 16, 1024, "64",
        "rows of long work (prefill slices, embedding slices, reranking) that a scheduler "
        "step adds to the one decode row of every running generation; smaller: shorter gaps "
        "between tokens while long work runs, larger: long work finishes sooner"),
    CHOICE(sched, "batched|serial", "batched",
           "`batched`: every step is one forward pass over all running sequences; `serial`: "
           "each sequence its own forward and long work run to completion (the behaviour "
           "before the step scheduler, kept to measure against)"),
    INT(kv_budget_mb, 0, INT_MAX, "1024",
        "resident KV cap in MiB, 0 = none; chunks of idle contexts over it are dropped "
        "(LCTRU order: heaviest precision first, least recently used first), already on "
        "disk, for the next call to read or recompute; with several generate models each "
        "gets an equal share"),
    INT(prompt_cache_mb, 0, INT_MAX, "256",
        "KV of recent Complete prompts (the gateway's chat and completion requests) kept in "
        "MiB, for the same app's next prompt on the same model that begins the same way to "
        "resume instead of evaluating it again (a chat resends its whole conversation every "
        "turn); least recently used first out; 0 = off. Held inside `kv_budget_mb`, not "
        "beside it: running work that needs room under the budget takes it back first, "
        "before any context's chunk; with several generate models each gets an equal share"),
    INT(prefill_budget_mb, 0, INT_MAX, "0",
        "working memory of a prefill step in MiB (activations, attention score blocks), "
        "0 = none: the runner's rows per step and score blocks are planned "
        "(`engine/model/prefill.h`) so that a prompt of `n_ctx` tokens fits, `step_tokens` "
        "shrinking with the rows when it must; when even one row per step does not fit, "
        "llmsd does not start and says how many MiB are needed. `llmsctl plan "
        "--prompt-tokens N [--model M]` (admin) prints the plan of a prompt length step by "
        "step, beside the unpartitioned step's (`unpart.`: one score block per head on a "
        "step of the runner's rows, at most 512 or so, not the whole prompt, which the "
        "scheduler never runs at once)"),
    INT(resident_small_mb, -1, INT_MAX, "-1",
        "weights (`model_load = map`) resident by size: the smallest matrices up to this "
        "many MiB stay, the others are prefetched per layer (`MADV_WILLNEED`) and released "
        "after it (`MADV_DONTNEED`) in forwards of 64 rows or more; -1 = all resident"),
    INT(kv_wait_ms, 0, INT_MAX, "30000",
        "how long a Call or Complete waits for running calls to leave room under "
        "`kv_budget_mb` before `RESOURCE_EXHAUSTED`; a call needing more than the whole "
        "budget is refused at once (`INVALID_ARGUMENT`). A call's logprobs count beside its KV "
        "(with 20 alternatives a few KiB per token of max_tokens)"),
    CHOICE(kv_compress, "tolerance|int8|none", "tolerance",
           "chunk compression after a call: `tolerance` (K and V widths of 2-8 bits and V's "
           "layout per chunk and layer once the model's layers are calibrated, per chunk "
           "before, by attention density and value spread), `int8`, `none` (f16, lossless)"),
    FLT(kv_compress_ratio, 0.25, 1, "0.6",
        "tolerance mode: bytes of the compressed chunks over their bytes as int8 (scales "
        "included), in [0.25, 1]; uniform int4 is 0.53-0.6 by head size"),
    INT(kv_calib_inline_ms, 1, INT_MAX, "2000",
        "tolerance mode: the model's layer calibration (once per model shape) runs at the "
        "end of the first long enough call when its first forward predicts at most this "
        "many ms in all, else one forward at a time in idle time (`idle_after_ms`)"),

    HEADING("Generation defaults (a context's own and a request's params override them)"),
    FLT(temperature, 0, 100, "0.8", "sampling temperature, 0 = greedy"),
    INT(top_k, 0, INT_MAX, "40", "keep only the k most likely tokens, 0 = off"),
    FLT(top_p, FLT_MIN, 1, "0.95",
        "keep the smallest set of tokens whose probabilities add up to p, in (0, 1]; "
        "1 = off"),
    FLT(min_p, 0, 1, "0.05",
        "drop tokens less likely than min_p times the most likely one, in [0, 1]; 0 = off"),
    FLT(repeat_penalty, FLT_MIN, 100, "1.0", "penalty on tokens seen recently, 1 = off"),
    FLT(frequency_penalty, -2, 2, "0",
        "subtracted from a token's logit once per time it occurs among the recent tokens "
        "(OpenAI's), in [-2, 2]; 0 = off"),
    FLT(presence_penalty, -2, 2, "0",
        "subtracted from a token's logit once if it occurs among the recent tokens "
        "(OpenAI's), in [-2, 2]; 0 = off"),
    INT(repeat_last_n, -1, INT_MAX, "64",
        "how many recent tokens the penalties look at, -1 = the whole history"),
    INT(min_keep, 0, INT_MAX, "0",
        "the fewest tokens top-p, min-p, locally typical sampling and XTC may keep"),
    FLT(typical_p, FLT_MIN, 1, "1.0",
        "locally typical sampling: keep the tokens nearest the expected surprise until "
        "their probabilities add up to p, in (0, 1]; 1 = off"),
    FLT(top_n_sigma, -1, 100, "-1",
        "keep the tokens whose logit is within n standard deviations of the largest; "
        "<= 0 = off"),
    FLT(xtc_probability, 0, 1, "0",
        "XTC (exclude top choices): the chance per token of dropping every likely token "
        "but the least likely of them, in [0, 1]; 0 = off"),
    FLT(xtc_threshold, 0, 1, "0.1",
        "XTC: the probability from which a token is a top choice; above 0.5 = off"),
    FLT(dynatemp_range, 0, 100, "0",
        "dynamic temperature: the temperature within +- this range by the entropy of the "
        "token's distribution, in [0, 100]; 0 = off"),
    FLT(dynatemp_exponent, 0, 100, "1.0",
        "dynamic temperature: the exponent on the normalised entropy"),
    FLT(dry_multiplier, 0, 100, "0",
        "DRY (don't repeat yourself): the penalty on a token that would extend a sequence "
        "already in the context, in [0, 100]; 0 = off"),
    FLT(dry_base, 1, 100, "1.75",
        "DRY: the penalty grows by this factor per token of the repeated sequence"),
    INT(dry_allowed_length, 0, INT_MAX, "2",
        "DRY: repeated sequences this long go unpenalised"),
    INT(dry_penalty_last_n, -1, INT_MAX, "-1",
        "DRY: how many recent tokens are searched for repeats, -1 = the window, 0 = off"),
    INT(mirostat, 0, 2, "0",
        "Mirostat in place of the sampler chain (top-k, top-p and the others): 0 = off, "
        "1 or 2 (its version)"),
    FLT(mirostat_tau, 0, 100, "5.0", "Mirostat: the target surprise, in bits"),
    FLT(mirostat_eta, 0, 1, "0.1", "Mirostat: the learning rate"),
    INT(max_tokens, 1, 1 << 24, "256",
        "tokens generated per call at most, unless the call asks for another number"),

    HEADING("Speculative decoding (requests may choose their own)"),
    CHOICE(speculate, "off|lookup|draft|both", "off",
           "draft tokens a generation verifies in one batched forward of its model: lookup "
           "(the tokens that followed the latest earlier occurrence of its last 2-4 tokens in "
           "its own context: free, and right where answers quote passages or code), draft "
           "(`draft_model`'s greedy continuation), both (lookup, else the draft model), or "
           "off. Greedy output, and sampled output with a seed, is token for token what it "
           "is without"),
    OPT(draft_model,
        "the registry name of a small decoder on the generate model's vocabulary that "
        "drafts for the default generate model (give its `model.NAME` line the `draft` "
        "role: it gets a runner and KV pool of its own); a model without the role or with "
        "another vocabulary stops the daemon at start, naming the first token that "
        "differs; `none`: no draft model (requests for draft drafts get none)"),
    INT(speculate_max, 1, 32, "8",
        "draft tokens a generation verifies per step at most; each adapts its own number "
        "to how many it has had accepted"),
    INT(speculate_rows, 0, 4096, "16",
        "rows a step may reach with draft tokens: a step of that many rows still costs "
        "about what one row does (decode reads the weights once for all of them), so "
        "speculation fills the rows the decoding streams leave and backs off as streams "
        "fill them; 0: speculation off"),

    HEADING("Embeddings and reranking"),
    INT(embed_max_texts, 1, INT_MAX, "256",
        "texts per Embed request (more: `INVALID_ARGUMENT`)"),
    OPT(embed_model,
        "shorthand for a registry model with the embed role, named after its file, the "
        "default for Embed and new knowledge bases: a bert encoder GGUF (bge, MiniLM, e5, "
        "gte), a nomic-bert one (nomic-embed-text v1/v1.5), a gemma-embedding one "
        "(EmbeddingGemma) or a decoder embedding model "
        "(Qwen3-Embedding, gte-Qwen2; pooled as its `{arch}.pooling_type` says), e.g. "
        "/var/lib/llmsd/bge-small-en-v1.5-f16.gguf; opened and mapped at start (a file that "
        "cannot embed stops the daemon with a message); `none`: the `model` embeds"),
    /* "none" by default, as embed_model: a sample value would name a file that the
     * installed llmsd.conf then makes the daemon open, whatever `model` is set to */
    OPT(rerank_model,
        "shorthand for a registry model with the rerank role, named after its file, the "
        "default for Rerank: a decoder reranker (Qwen3-Reranker) or a bert cross-encoder "
        "with a classification head (bge-reranker, ms-marco MiniLM); its reranker opens on "
        "its first Rerank call. The same file as `model` adds the role to that model "
        "(mapped once); `none`: the `model`"),
    INT(rerank_stream_weights, 0, 1, "1",
        "1 = the reranker reads each layer's weights from the file while the previous layer "
        "computes (two layer buffers) instead of mapping the whole model"),
    INT(rerank_memory_mb, 0, INT_MAX, "0",
        "activation memory of one chunk of candidates in MiB, 0 = the engine's default; "
        "when all candidates' hidden states exceed it (over three chunks) they go to an "
        "unlinked file in `$TMPDIR` (else `/tmp`)"),
    INT(rerank_yes_token, -1, INT_MAX, "-1",
        "token id scored as \"yes\", -1 = look \"yes\" up in the vocabulary"),
    INT(rerank_no_token, -1, INT_MAX, "-1",
        "token id scored as \"no\", -1 = look \"no\" up"),
    INT(rerank_max_documents, 1, INT_MAX, "256",
        "documents per Rerank request and per calibration query (more: "
        "`INVALID_ARGUMENT`)"),
    INT(rerank_max_bytes, 1, INT_MAX, "4194304",
        "bytes of query + documents per Rerank request (more: `INVALID_ARGUMENT`)"),

    HEADING("The OpenAI-compatible HTTP gateway (off while both listeners are `none`)"),
    OPT(http_socket,
        "Unix socket of the gateway (`curl --unix-socket`; mode `socket_mode`); a caller is "
        "its peer uid and the app its `X-Llmsd-App` header names (`default` without one, as "
        "every client); `none`: off"),
    OPT(http_socket_group,
        "group of `http_socket`; `none`: the group of the clients' socket (under systemd the "
        "socket unit's `SocketGroup=`, `llms`; run by hand, llmsd's own group). llmsd must "
        "be a member of it (the unit's `SupplementaryGroups=llms`)"),
    OPT(http_listen,
        "`host:port` of the gateway on TCP, e.g. 127.0.0.1:8080 (port 0: any); a "
        "non-loopback address stops the daemon unless `http_allow_remote = 1`; a caller is "
        "its bearer token, looked up in `http_tokens_file`; `none`: off"),
    INT(http_allow_remote, 0, 1, "0",
        "1: `http_listen` may name a non-loopback address (tokens then travel in clear "
        "text)"),
    OPT(http_tokens_file,
        "the TCP gateway's tokens (llmsd refuses a file others may read or anyone but its "
        "owner may write): lines `TOKEN UID APP [admin]` (`#` comments; UID a number or a "
        "user name; `admin` may read `/metrics`); read again on SIGHUP (`systemctl reload "
        "llmsd`); `none`: every TCP request is 401"),
    INT(http_max_body_bytes, 1024, 1 << 30, "8388608",
        "largest request body answered; a larger one is 413 in JSON, from its "
        "Content-Length, before it is read"),
    INT(http_header_timeout_ms, 1, INT_MAX, "10000",
        "a connection's first request head must arrive whole within this long of the "
        "connection, a later one within this long of its first byte (a kept-alive "
        "connection waits 60 s for that byte, then closes); else 408 in JSON and the "
        "connection closes"),
    INT(http_body_timeout_ms, 1, INT_MAX, "10000",
        "a request body must arrive whole within this long of its head plus 1 s a MiB of "
        "its Content-Length, else 408 and the connection closes"),
    INT(http_max_body_buffered_bytes, 0, INT_MAX, "67108864",
        "bytes of request bodies the gateway holds while they arrive, every uid together: "
        "a request's Content-Length is reserved when its head arrives, and one that would "
        "pass this is 503 in JSON before its body is read; given back once the body is "
        "parsed"),
    INT(http_max_body_buffered_bytes_per_uid, 0, INT_MAX, "16777216",
        "the same for one uid's requests together (429), checked first, so that no uid can "
        "spend the whole `http_max_body_buffered_bytes`"),
    INT(http_max_unauthenticated_connections, 1, INT_MAX, "16",
        "TCP connections of the gateway that have not sent a request with a valid token "
        "yet, every peer together (one more: 429 and closed); they count in "
        "`max_connections` too"),
    INT(responses_store_bytes, 0, INT_MAX, "33554432",
        "bytes of the Responses API's stored responses (`store`, `previous_response_id`, "
        "`GET`/`DELETE /v1/responses/{id}`), every uid together, in the gateway's memory "
        "and (`responses_store = disk`) the state directory alike: the oldest go first to "
        "make room, one response may take at most half; 0: nothing is stored (`store` is "
        "false in every response)"),
    CHOICE(responses_store, "disk|memory", "disk",
           "where stored responses are kept besides the gateway's memory: `disk` writes each "
           "to the state directory's catalog too (by the worker, not the event loop), so "
           "that they survive a restart (read back when llmsd starts, within "
           "`responses_store_bytes`); `memory` keeps them in memory only, none surviving a "
           "restart, and deletes those an earlier `disk` left when llmsd starts"),
    CHOICE(reasoning_format, "auto|deepseek|none", "auto",
           "a reasoning model's thinking (`<think>...</think>` before the answer, from a "
           "model whose chat template has those markers: Qwen3, QwQ, the DeepSeek-R1 "
           "distills), as llama.cpp's `--reasoning-format` names it: `auto` or `deepseek` "
           "give it apart from the answer (OpenAI's routes as `reasoning_content`, the "
           "Responses API as a reasoning item, ollama's as `thinking`), `none` leaves it in "
           "the answer's text; a request's own `reasoning_format` (ollama: `think`) "
           "chooses otherwise"),

    HEADING("Knowledge bases and RAG"),
    INT(kb_passage_tokens, 8, 4096, "64",
        "tokens of a knowledge base's passage unless its KbCreate says"),
    INT(kb_overlap_tokens, 0, 4095, "16", "tokens consecutive passages share"),
    INT(kb_max_per_app, 0, INT_MAX, "16", "knowledge bases of an app"),
    INT(kb_max_doc_bytes, 1, INT_MAX, "1048576", "text bytes of one document"),
    INT(kb_max_add_bytes, 1, INT_MAX, "4194304",
        "text bytes of one KbAdd request, all its documents"),
    INT(kb_max_mb_per_uid, 0, INT_MAX, "256",
        "document text of all a uid's knowledge bases in MiB"),
    INT(kb_max_passages_per_uid, 0, INT_MAX, "1000000",
        "passages of all a uid's knowledge bases"),
    INT(kb_ivf_min_passages, 0, INT_MAX, "10000",
        "vector search of a knowledge base with at least this many passages goes through "
        "an IVF index (`storage/ivf.h`), 0 = never (always brute force)"),
    INT(kb_ivf_nprobe, 1, 65536, "16", "lists an IVF search of a knowledge base visits"),
    INT(kb_ivf_hot_mb, 0, INT_MAX, "64",
        "MiB of the knowledge bases' most searched IVF lists kept packed in large pages, "
        "refreshed in idle time; 0 = off"),
    INT(rag_top_k, 1, 64, "3", "passages a RagQuery puts in its prompt"),
    STR(rag_system_prompt, "Answer the question using the passages.",
        "system prompt of a RagQuery unless the request has one"),
    FLT(tau_query, 0, 2, "0.85",
        "QA bank: a question this close (cosine) to a stored one is answered from it at "
        "once; > 1 turns the QA bank off"),
    INT(k_refresh, 1, 64, "3",
        "a new passage ranking in a stored question's top `k_refresh` makes its answer "
        "stale"),
    INT(qkv_cache_mb, 0, INT_MAX, "256",
        "stored QKV prefix tree in MiB (compressed), least frequently used leaves evicted; "
        "0 = off"),
    INT(qa_cache_mb, 0, INT_MAX, "64", "stored QA bank in MiB, oldest entries evicted"),
    INT(cache_owner_max_mb, 0, INT_MAX, "128",
        "MiB one cache owner (an app; the apps of a uid together for knowledge bases made "
        "with `share_uid`) may keep in the QKV tree and in the QA bank, each; over it the "
        "owner's own least used entries go, and a level over its budget evicts from the "
        "largest owner first; 0 = the level's budget (`qkv_cache_mb`, `qa_cache_mb`)"),
    INT(cache_owner_max_entries, 0, INT_MAX, "100000",
        "QKV nodes, and QA entries, one cache owner may keep; 0 = no limit"),

    HEADING("Workflow graphs"),
    INT(graph_max_per_app, 0, INT_MAX, "64", "workflow graphs an app may keep"),
    INT(graph_max_nodes, 1, 1024, "32", "nodes of a workflow graph"),
    INT(graph_max_steps, 1, 100000, "64",
        "node runs of a graph run at most; a graph's `max_steps` may not exceed it"),
    INT(graph_speculate, 0, 1, "0",
        "1: runs speculate unless they say otherwise: a generation node starts on its "
        "retrieval's estimate (BM25 before the query is embedded), a retrieval on the first "
        "`graph_spec_tokens` tokens of the generation feeding it; either is redone when the "
        "final input differs (greedy answers are the same either way). Off by default: it "
        "measured no faster in bench/workflow"),
    INT(graph_spec_tokens, 1, 65536, "8",
        "tokens a generation feeding a retrieval has made when the retrieval starts "
        "speculatively"),
    INT(graph_reuse_kv, 0, 1, "1",
        "a graph run's generation node starts from the KV of the run's previous one where "
        "their prompts begin with the same tokens; 0: every prompt evaluated whole"),

    HEADING("Idle-time prediction and the cache scheduler"),
    INT(predict_budget, 0, 100000, "0",
        "predicted queries (and the generations proposing them) per idle period; 0 = off"),
    INT(idle_after_ms, 1, INT_MAX, "5000",
        "no request for this long starts idle-time work: prediction, warm-ups, a layer "
        "calibration"),
    INT(predict_stride, 1, 100000, "4",
        "knowledge-based prediction asks about every stride-th new passage and rewrites a "
        "knowledge base's abstract after each stride new passages"),
    INT(predict_max_tokens, 1, 4096, "48",
        "tokens of a generated abstract, proposed question or paraphrase at most"),
    INT(predict_warm, 0, 1000000, "256",
        "warm-ups, only while `predict_budget` > 0: new passages (newest first) prefilled "
        "per idle period as a prompt's first passage, into the QKV tree"),
    FLT(tau_scheduler, 0, 2, "0.9",
        "`tau_query` at or above this: predicted queries are only prefilled (QKV tree); "
        "below: prefilled and decoded (QA bank too)"),
};

#define N_KEYS (sizeof keys / sizeof keys[0])

/* The special key: "model.NAME = PATH [ROLES]" lines, any number of NAMEs, documented
 * right after the model key. */
#define MODEL_PREFIX "model."
#define MODEL_LINE_KEY "model.NAME"
#define LIT(x) #x
#define MACRO_LIT(x) LIT(x)
#define MODEL_LINE_HELP                                                                     \
    "`PATH [ROLES]`: one more model of the registry (daemon/README.md, \"The model "         \
    "registry\"), named NAME (1.." MACRO_LIT(MODELS_NAME_MAX) " bytes of `[A-Za-z0-9._-]`); " \
    "ROLES a comma list of `generate`, `embed`, `rerank`, `draft` (`draft_model`), default "  \
    "by the file's kind "                                                                    \
    "(decoder: generate, bert encoder: embed, bert cross-encoder: rerank); repeatable, at "  \
    "most " MACRO_LIT(CONFIG_MODELS_MAX) "; a path with blanks needs ROLES after it. One "   \
    "model generates; requests name a model or get their kind's default"

/* The other special key: "lora.NAME = BASE ADAPTER.gguf[:SCALE] ...", after model.NAME. */
#define LORA_PREFIX "lora."
#define LORA_LINE_KEY "lora.NAME"
#define LORA_LINE_HELP                                                                       \
    "`BASE ADAPTER.gguf[:SCALE] ...`: a generate model named NAME made of the registry "      \
    "model BASE's weights (mapped once, shared) and LoRA adapters in llama.cpp's format, "  \
    "each at its scale (default 1; its alpha / rank applies too), up to "                     \
    MACRO_LIT(CONFIG_LORA_ADAPTERS_MAX) " blank-separated (paths without blanks; a path "   \
    "ending in `:NUMBER` needs a scale after it); requests name it as any model "            \
    "(daemon/README.md, \"LoRA adapters\"); repeatable, at most "                          \
    MACRO_LIT(CONFIG_LORAS_MAX)

static bool followed_by_model_lines(const key_def *k)
{
    return strcmp(k->name, "model") == 0;
}

int config_defaults(config *c, char err[ERR_MAX])
{
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < N_KEYS; i++)
        if (keys[i].def && config_set(c, keys[i].name, keys[i].def, err))
            return -1;
    return 0;
}

static const key_def *find_key(const char *name)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if (keys[i].type != KEY_HEADING && strcmp(keys[i].name, name) == 0)
            return &keys[i];
    return NULL;
}

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
            model_name_ok(key + strlen(MODEL_PREFIX))) ||
           (strncmp(key, LORA_PREFIX, strlen(LORA_PREFIX)) == 0 &&
            model_name_ok(key + strlen(LORA_PREFIX)));
}

int config_lora_next(const char **p, char path[CONFIG_PATH_MAX], float *scale, char err[ERR_MAX])
{
    const char *s = *p;
    while (isspace((unsigned char)*s))
        s++;
    size_t n = 0;
    while (s[n] && !isspace((unsigned char)s[n]))
        n++;
    *p = s + n;
    if (n == 0)
        return 0;
    *scale = 1.0f;
    /* WORD:NUMBER is a file and its scale; a ':' followed by anything else is the path's */
    const char *colon = memrchr(s, ':', n);
    size_t path_len = n;
    if (colon && colon > s && colon + 1 < s + n) {
        char num[64], *end;
        size_t len = (size_t)(s + n - colon - 1);
        snprintf(num, sizeof num, "%.*s", (int)(len < sizeof num ? len : sizeof num - 1), colon + 1);
        errno = 0;
        float v = strtof(num, &end);
        bool numeric = len < sizeof num && end != num && *end == '\0';
        /* a word that reads as a number but is none to use ("inf", "1e99") is a mistake */
        if (numeric && (errno || !isfinite(v)))
            return err_set(err, "adapter '%.*s': scale '%s' is not a finite number",
                           (int)(n > 200 ? 200 : n), s, num);
        if (numeric) {
            *scale = v;
            path_len = (size_t)(colon - s);
        }
    }
    if (path_len >= CONFIG_PATH_MAX)
        return err_set(err, "adapter path longer than %d bytes", CONFIG_PATH_MAX - 1);
    memcpy(path, s, path_len);
    path[path_len] = '\0';
    return 1;
}

/* "lora.NAME = BASE ADAPTER[:SCALE] ...": the base's name, then the adapters as written,
 * each checked (config_lora_next). */
static int set_lora_line(config *c, const char *key, const char *value, char err[ERR_MAX])
{
    const char *name = key + strlen(LORA_PREFIX);
    char why[ERR_MAX], path[CONFIG_PATH_MAX];
    if (!model_name_ok(name))
        return err_set(err, "%.80s: a model name is 1..%d bytes of [A-Za-z0-9._-]", key,
                       MODELS_NAME_MAX);
    while (isspace((unsigned char)*value))
        value++;
    size_t base_len = 0;
    while (value[base_len] && !isspace((unsigned char)value[base_len]))
        base_len++;
    char base[MODELS_NAME_MAX + 2];
    snprintf(base, sizeof base, "%.*s", (int)(base_len < sizeof base ? base_len : sizeof base - 1),
             value);
    if (base_len == 0 || base_len > MODELS_NAME_MAX || !model_name_ok(base))
        return err_set(err, "%s: '%.*s' is no base model name (1..%d bytes of [A-Za-z0-9._-], "
                            "then the adapters)", key, (int)(base_len > 60 ? 60 : base_len),
                       value, MODELS_NAME_MAX);
    const char *adapters = value + base_len;
    while (isspace((unsigned char)*adapters))
        adapters++;
    size_t len = strlen(adapters);
    while (len > 0 && isspace((unsigned char)adapters[len - 1]))
        len--;
    if (len >= CONFIG_PATH_MAX)
        return err_set(err, "%s: the adapters are longer than %d bytes", key, CONFIG_PATH_MAX - 1);
    int n = 0, rc;
    float scale;
    for (const char *p = adapters; (rc = config_lora_next(&p, path, &scale, why)) == 1;)
        if (++n > CONFIG_LORA_ADAPTERS_MAX)
            return err_set(err, "%s: at most %d adapters", key, CONFIG_LORA_ADAPTERS_MAX);
    if (rc < 0)
        return err_set(err, "%s: %s", key, why);
    if (n == 0)
        return err_set(err, "%s: no adapter after the base model '%s' (lora.NAME = BASE "
                            "ADAPTER.gguf[:SCALE] ...)", key, base);
    int i = 0;
    while (i < c->n_loras && strcmp(c->loras[i].name, name) != 0)
        i++;
    if (i == CONFIG_LORAS_MAX)
        return err_set(err, "%s: more than %d lora.NAME lines", key, CONFIG_LORAS_MAX);
    config_lora *l = &c->loras[i];
    strcpy(l->name, name);
    strcpy(l->base, base);
    memcpy(l->adapters, adapters, len);
    l->adapters[len] = '\0';
    if (i == c->n_loras)
        c->n_loras++;
    return 0;
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
        return err_set(err, "%s: '%.40s' is not a roles list (generate,embed,rerank,draft)", key,
                       roles);
    for (const char *p = value + cut; cut > 0 && p < value + n;) {
        size_t len = strcspn(p, ",");
        if (len > (size_t)(value + n - p))
            len = (size_t)(value + n - p);
        if (!((len == 8 && !strncmp(p, "generate", 8)) || (len == 5 && !strncmp(p, "embed", 5)) ||
              (len == 6 && !strncmp(p, "rerank", 6)) || (len == 5 && !strncmp(p, "draft", 5))))
            return err_set(err, "%s: roles '%.*s': each is generate, embed, rerank or draft", key,
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
    if (strncmp(key, LORA_PREFIX, strlen(LORA_PREFIX)) == 0)
        return set_lora_line(c, key, value, err);
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
    case KEY_INT:
    case KEY_U32: {
        long long v = strtoll(value, &end, 10);
        if (end == value || *end || errno)
            return err_set(err, "%s: '%s' is not an integer", key, value);
        if ((double)v < k->min || (double)v > k->max)
            return err_set(err, "%s: %lld is outside [%.0f, %.0f]", key, v, k->min, k->max);
        if (k->type == KEY_U32)
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
    case KEY_HEADING:
        break;
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
    int device;
    if (cuda_parse_device(c->device, &device, err) < 0)
        return -1;
    return 0;
}

/* Writes n bytes of s without the backquotes of its `code` spans. */
static void put_plain(FILE *out, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != '`')
            fputc(s[i], out);
}

static void print_key_line(FILE *out, const char *name, const char *help, const char *def)
{
    fprintf(out, "  --%-24s ", name);
    put_plain(out, help, strlen(help));
    if (def)
        fprintf(out, " (default %s)", def);
    fputc('\n', out);
}

void config_print_keys(FILE *out)
{
    for (size_t i = 0; i < N_KEYS; i++) {
        const key_def *k = &keys[i];
        if (k->type == KEY_HEADING) {
            fputc('\n', out);
            put_plain(out, k->help, strlen(k->help));
            fputs(":\n", out);
            continue;
        }
        print_key_line(out, k->name, k->help, k->def);
        if (followed_by_model_lines(k)) {
            print_key_line(out, MODEL_LINE_KEY, MODEL_LINE_HELP, NULL);
            print_key_line(out, LORA_LINE_KEY, LORA_LINE_HELP, NULL);
        }
    }
}

/* A Markdown table cell: the text as it is, but '|' would end the cell. */
static void put_cell(FILE *out, const char *s)
{
    for (; *s; s++) {
        if (*s == '|')
            fputc('\\', out);
        fputc(*s, out);
    }
}

static void markdown_row(FILE *out, const char *name, const char *def, const char *help)
{
    fprintf(out, "| `%s` | ", name);
    if (def) {
        fputc('`', out);
        put_cell(out, def);
        fputc('`', out);
    } else {
        fputs("(unset)", out);
    }
    fputs(" | ", out);
    put_cell(out, help);
    fputs(" |\n", out);
}

static void print_markdown(FILE *out)
{
    fputs(CONFIG_DOC_BEGIN "\n", out);
    for (size_t i = 0; i < N_KEYS; i++) {
        const key_def *k = &keys[i];
        if (k->type == KEY_HEADING) {
            fprintf(out, "%s**%s**\n\n| key | default | meaning |\n|---|---|---|\n",
                    i > 0 ? "\n" : "", k->help);
            continue;
        }
        markdown_row(out, k->name, k->def, k->help);
        if (followed_by_model_lines(k)) {
            markdown_row(out, MODEL_LINE_KEY, NULL, MODEL_LINE_HELP);
            markdown_row(out, LORA_LINE_KEY, NULL, LORA_LINE_HELP);
        }
    }
    fputs(CONFIG_DOC_END "\n", out);
}

#define CONF_WIDTH 88

/* Writes text as "# " comment lines of at most CONF_WIDTH columns (a longer word makes a
 * longer line), backquotes dropped. sentence: the table's phrase (a key's help) made a
 * sentence, capitalised and ended with a full stop. */
static void put_comment(FILE *out, const char *text, bool sentence)
{
    size_t col = 0;
    for (const char *p = text; *p;) {
        while (*p == ' ')
            p++;
        if (!*p)
            break;
        size_t n = strcspn(p, " "), width = 0;
        for (size_t i = 0; i < n; i++)
            width += p[i] != '`';
        bool stop = sentence && !p[n] && p[n - 1] != '.';
        if (col > 0 && col + 1 + width + stop > CONF_WIDTH) {
            fputc('\n', out);
            col = 0;
        }
        fputs(col == 0 ? "# " : " ", out);
        col += col == 0 ? 2 : 1;
        if (sentence && p == text && islower((unsigned char)*p)) {
            fputc(toupper((unsigned char)*p), out);
            put_plain(out, p + 1, n - 1);
        } else {
            put_plain(out, p, n);
        }
        if (stop)
            fputc('.', out);
        col += width + stop;
        p += n;
    }
    if (col > 0)
        fputc('\n', out);
}

static void print_conf(FILE *out)
{
    fputs("# " CONFIG_DEFAULT_PATH " — settings of llmsd, the LLM system service.\n#\n", out);
    char intro[1024];
    size_t n = (size_t)snprintf(intro, sizeof intro, "%s",
                                "One \"key = value\" per line; '#' starts a comment. Every "
                                "key can also be given on llmsd's command line as --key "
                                "VALUE, which overrides this file. An unknown key or a bad "
                                "value stops the daemon at startup with a message naming "
                                "it. The values below are the built-in defaults, except "
                                "those of the keys that have none:");
    for (size_t i = 0; i < N_KEYS && n < sizeof intro; i++)
        if (keys[i].type != KEY_HEADING && !keys[i].def)
            n += (size_t)snprintf(intro + n, sizeof intro - n, " %s,", keys[i].name);
    if (n < sizeof intro)
        intro[n - 1] = '.';
    put_comment(out, intro, false);
    fputs("#\n", out);
    put_comment(out,
                "Made by `llmsd --print-settings=conf` from its settings table "
                "(daemon/config.c).",
                false);
    for (size_t i = 0; i < N_KEYS; i++) {
        const key_def *k = &keys[i];
        fputc('\n', out);
        if (k->type == KEY_HEADING) {
            char title[256];
            snprintf(title, sizeof title, "---- %s ----", k->help);
            put_comment(out, title, false);
            continue;
        }
        put_comment(out, k->help, true);
        fprintf(out, "%s = %s\n", k->name, k->def ? k->def : k->example);
        if (followed_by_model_lines(k)) {
            fputc('\n', out);
            put_comment(out, "`" MODEL_LINE_KEY "` = " MODEL_LINE_HELP, true);
            fputs("#" MODEL_PREFIX "minilm = /var/lib/llmsd/all-MiniLM-L6-v2-f16.gguf embed\n"
                  "#" MODEL_PREFIX "bge-rr = /var/lib/llmsd/bge-reranker-base-f16.gguf rerank\n",
                  out);
            fputc('\n', out);
            put_comment(out, "`" LORA_LINE_KEY "` = " LORA_LINE_HELP, true);
            fputs("#" LORA_PREFIX "sql = model /var/lib/llmsd/sql-lora-f16.gguf\n"
                  "#" LORA_PREFIX "terse = model /var/lib/llmsd/style-lora-f16.gguf:0.5\n",
                  out);
        }
    }
}

int config_print_settings(FILE *out, config_doc format, char err[ERR_MAX])
{
    if (format == CONFIG_DOC_MARKDOWN)
        print_markdown(out);
    else
        print_conf(out);
    if (fflush(out) || ferror(out))
        return err_set(err, "writing the settings' documentation: %s", strerror(errno));
    return 0;
}
