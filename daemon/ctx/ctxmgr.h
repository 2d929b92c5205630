/*
 * ctxmgr.h — the daemon's contexts and their KV memory (the LLMS context memory).
 *
 * A context is an app's conversation: its token history (what the model has seen), its
 * messages (to render the chat template), and its KV. The KV is a kv_seq whose slot i is
 * chunk i, covering tokens [16 i, 16 i + 16) of the history; a slot is NULL while the
 * chunk is not resident. Beside it the chunk map (ctx_chunk) says, for every chunk, what
 * the store holds, whether the resident copy still has to be written, how much attention
 * the chunk receives (its information density) and when it was last used.
 *
 * Memory policy, all here and in ctxload.c / ctxprofile.c:
 * - Claim: before KV is allocated, room is made under the global budget by Reclaim.
 * - Reclaim: resident chunks of idle contexts are dropped in LCTRU order (sub-queues per
 *   precision, heaviest first, each least recently used first); a dirty one is written
 *   first. Chunks of contexts inside a call are locked.
 * - Load (ctx_call_begin): every chunk of the history is made resident before the call,
 *   partly read from the store and partly recomputed, as a cost model says is fastest,
 *   reads of layer l + 1 overlapping the recompute of layer l.
 * - Fault: a NULL slot met by a forward is brought in synchronously (counted).
 * - Ahead-of-time swap-out (ctx_call_end): after a call the full chunks get their
 *   precision (kv_compress) and every modified chunk is written, so Reclaim only drops.
 *   The writing (compress, write, sync) runs on the swap-out thread (swapout.h) and the
 *   worker commits the catalog rows when told it is done (ctx_collect_writes); a call,
 *   eviction or reclaim that needs a context's chunks first waits for its writes.
 * - Persistence: at startup the store's chunk records come back as on-disk chunks.
 * - Sliding window (ctxwindow.c): a call that would take a context past its window
 *   (the call's token limit) either stops (CTX_OVERFLOW_REFUSE) or slides it: the first
 *   window_sink tokens (whole chunks: attention sinks and the system prompt) stay, the
 *   oldest tokens after them leave the model's view, and the most recent ones are
 *   evaluated again at their new positions, so that the KV is what a fresh prefill of
 *   the kept tokens gives (StreamingLLM, which LLMS uses when a context outgrows its
 *   window). The store keeps every turn (the archive: messages and their tokens) and
 *   the window over them (sink, dropped); the dropped chunks' blobs are deleted with the
 *   turn's commit.
 *
 * All functions are called from the worker thread only (the store is single-threaded);
 * the other threads are the switch-in reader, internal to a call of ctx_call_begin, and
 * the swap-out thread, which touches chunk files and the chunks it writes only.
 */
#ifndef LLMS_CTXMGR_H
#define LLMS_CTXMGR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"
#include "engine/kv/kv.h"
#include "engine/model/model.h"
#include "proto/llms.pb-c.h"
#include "storage/store.h"

#define CTX_ID_LEN 32 /* hex characters of 128 random bits */

/* Returned (instead of -1) by functions that claim KV memory when the budget cannot
 * hold what is asked even after reclaiming every unlocked chunk. */
#define CTX_E_BUDGET (-2)

typedef struct ctx_msg {
    char *role;   /* "user", "assistant", or "raw" (text added without the template) */
    char *text;   /* user: the prompt; assistant: the reply as the client saw it (stop
                     strings removed) */
    int n_tokens; /* tokens the message added to the context */
} ctx_msg;

/* What the manager knows about one chunk of a context besides its resident data. */
typedef struct ctx_chunk {
    int disk_precision;   /* kv_precision of the stored blob (KV_MIXED: its layers differ,
                             ctx_entry.disk_layers); -1: not in the store */
    bool disk_layers_known; /* KV_MIXED: disk_layers holds the stored layers' precisions
                             (false after a restart until the blob's table is read) */
    int64_t disk_bytes;   /* uncompressed bytes of the stored blob */
    bool dirty;           /* the resident data is not what the store holds */
    float density;        /* mean attention its tokens receive per attending row */
    float k_spread;       /* kv_chunk_spread of its values; < 0: not measured yet */
    float v_spread;
    float vb_spread;
    uint64_t last_use;    /* manager clock when a call last used it */
} ctx_chunk;

/* What a call does when the context's window is full. */
enum ctx_overflow {
    CTX_OVERFLOW_WINDOW = 0, /* slide the window and go on */
    CTX_OVERFLOW_REFUSE = 1, /* stop the reply; later calls fail */
};

typedef struct ctx_entry {
    char id[CTX_ID_LEN + 1];
    int64_t app_id;
    uint32_t uid;
    char *app_name;
    char *system_prompt;               /* NULL when none */
    char *model;                       /* the generate model it belongs to; NULL: from
                                          before the registry (whichever generates) */
    Llms__GenerationParams *defaults;  /* NULL when none */
    int32_t *tokens;                   /* (n_tokens) the window: what the model sees of the
                                          history (all of it until the first slide) */
    int n_tokens, cap_tokens;
    ctx_msg *msgs;                     /* (n_msgs) every message, also those the window
                                          no longer covers (they render the template) */
    int n_msgs, cap_msgs;
    kv_seq seq;                        /* slot i: chunk i, NULL when not resident */
    ctx_chunk *map;                    /* (n_map) chunk i of the history */
    int n_map, cap_map;
    uint8_t *disk_layers;              /* (cap_map, n_layer) the precisions of a stored
                                          KV_MIXED chunk's layers */
    kv_chunk_stats *layer_stats;       /* (cap_map, n_layer) kv_chunk_layer_spread of each
                                          layer; valid while its chunk's k_spread >= 0 */
    /* Attention received by each token over the context's calls, and the number of
     * (row, layer, head) triples that could attend to it: density = attn / rows. */
    float *attn;                       /* (cap_attn) */
    float *rows;                       /* (cap_attn) */
    int cap_attn;
    bool busy;                         /* a Call is running on it: its chunks are locked */
    int n_writing;                     /* background writes of its chunks in flight */
    bool loaded;                       /* busy and every chunk of the history resident */
    int call_base;                     /* tokens of the history when the call began */
    /* Sliding window. tokens is the history's first window_sink tokens followed by the
     * tokens after window_sink + window_dropped. */
    enum ctx_overflow overflow;
    int window_sink;                   /* tokens every slide keeps (whole chunks); 0
                                          before the first slide */
    int64_t window_dropped;            /* tokens after the sink out of the window */
    uint64_t window_slides;
    int call_sink;                     /* inside a call: the sink its slides keep */
    int call_dropped;                  /* tokens its slides dropped (committed with the
                                          turn) */
    int call_slides;
    struct ctxmgr *cm;
    int64_t created_ms, last_used_ms;
    /* NULL, or why what the store holds of it cannot be used (ctx_open found it damaged):
     * it is listed with no history, calls on it are refused, its rows and chunk files
     * stay as they are until ctx_delete. */
    char *damage;
    struct ctx_entry *next;
} ctx_entry;

/* How chunks are compressed after a call. */
enum ctx_compress {
    CTX_COMPRESS_TOLERANCE, /* 2-8 bits by density and spread, per (chunk, layer) once the
                               model's layers are calibrated (kv_assign_layer_precisions),
                               per chunk before (kv_assign_precisions) */
    CTX_COMPRESS_INT8,      /* every full chunk int8 */
    CTX_COMPRESS_NONE,      /* f16 everywhere: lossless (the test mode) */
};

/* When modified chunks are written (benchmarks compare the others). */
enum ctx_swap {
    CTX_SWAP_AHEAD,       /* when the call returns (ahead of time): reclaim only drops */
    CTX_SWAP_ON_RECLAIM,  /* when reclaimed (swap at eviction) */
    CTX_SWAP_NONE,        /* never: a dropped chunk is recomputed (kill and recompute) */
};

/* How a context's missing chunks are brought in (benchmarks compare the others). */
enum ctx_switch {
    CTX_SWITCH_PLAN,          /* read or recompute each, from the cost models */
    CTX_SWITCH_READ,          /* read every stored chunk, recompute only the others */
    CTX_SWITCH_RECOMPUTE,     /* recompute everything */
};

/* A layer calibration runs at the end of a call when it takes at most this long (the
 * models bench/kvquant measures on take milliseconds, the TinyLlama-1.1B shape about 8 s
 * on 2 threads before the 8-bit bases added a third more forwards). */
#define CTX_CALIB_INLINE_MS 2000.0

typedef struct ctx_policy {
    size_t budget_bytes;         /* cap of resident KV and the pool's spare buffers
                                    (kv_pool_bytes_used + kv_pool_spare_bytes); 0: none */
    enum ctx_compress compress;
    double compress_ratio;       /* tolerance mode: bytes over their int8 bytes */
    enum ctx_swap swap;
    enum ctx_switch switch_mode;
    bool whole_context;          /* reclaim drops whole contexts, least recently used
                                    first, instead of single chunks in LCTRU order */
    bool sequential;             /* a switch-in reads its chunks, then recomputes the
                                    others: no pipelining (the ablation of benchmarks) */
    double calib_inline_ms;      /* a layer calibration expected to take longer runs in
                                    idle time (ctxcalib.c), not at the end of a call;
                                    0: CTX_CALIB_INLINE_MS */
} ctx_policy;

/* Linear cost models of a switch-in, in milliseconds, fitted by ctx_profile:
 * recompute(tokens, ctx) = a + b tokens + c tokens ctx; reading chunks whose pages are
 * not in the page cache (cold) = d + f chunks + e bytes, and reading cached ones (warm)
 * = warm_d + warm_f chunks + warm_e bytes (bytes: the chunks' KV as the pool holds it;
 * f: what every chunk file costs whatever its size, catalog row, open, header). Every
 * parameter is >= 0 by the fit's constraint, not by clamping; the residuals say how well
 * the lines fit. */
typedef struct ctx_cost {
    double rec_a, rec_b, rec_c;
    double io_d, io_e;
    double warm_d, warm_e;
    double io_f, warm_f;
    /* RMS relative residual of the per-point medians against each fitted line (0.1: the
     * line is 10% off a typical point) */
    double rec_resid, io_resid, warm_resid;
    double samples;    /* timed runs behind each point's median; 0: not measured (the
                          built-in guesses) */
} ctx_cost;

/* The models in use and how real switch-ins compared with them. Each switch-in
 * measures its recompute time and its read time. One that ran a single part updates
 * that part's correction factor (recompute, cold read or warm read: the one that
 * predicted most of the read) by the ratio observed / fitted; one that ran both at once
 * updates instead the two contention factors, each part's slowdown while the other
 * runs (on two cores a reader thread beside a two-thread forward was measured 1.6x
 * slower), which the plan applies only to plans that run both. Every factor is a
 * geometric moving average (weight 0.2 per switch-in, one observation counting as at
 * most 4x off the current factor, kept within [1/8, 8]), persisted with the models and
 * reset by a new profile. Parts of under a millisecond are not used (timer and
 * scheduling noise). */
typedef struct ctx_cost_report {
    ctx_cost fit;
    double rec_fix, cold_fix, warm_fix;  /* correction factors, 1 = as fitted */
    double rec_contention, read_contention; /* slowdowns when both parts run */
    uint64_t observed;                   /* switch-ins measured since the last profile */
    /* observed / predicted (the prediction the plan used, corrections included) over the
     * last 64 switch-ins that had such a part, median and last; 0 when none yet */
    double rec_median, rec_last;         /* recomputing */
    double read_median, read_last;       /* reading */
    double total_median, total_last;     /* the whole switch-in against the plan's
                                            prediction (ctxload.c) */
} ctx_cost_report;

/* What one switch-in did. */
typedef struct ctx_load_stats {
    double ms;                /* from the start of the load until the KV was complete */
    int64_t bytes_read;       /* from chunk files */
    int chunks_read, chunks_recomputed, chunks_resident;
    /* Of ms, reading and recomputing (after room was made under the budget), and the
     * plan's prediction of it (corrections included); each part observed and predicted
     * (0 for a part that did not run). */
    double load_ms, predicted_ms;
    double rec_ms, rec_predicted_ms;
    double read_ms, read_predicted_ms;
} ctx_load_stats;

/* Totals since ctx_open. */
typedef struct ctx_stats {
    uint64_t bytes_written, chunks_written;
    uint64_t bytes_read, chunks_read, chunks_recomputed;
    uint64_t chunks_reclaimed;
    uint64_t faults;            /* chunks brought in during a forward (should stay 0) */
    uint64_t bad_blobs;         /* stored chunks found corrupt or missing */
    uint64_t stale_blobs;       /* stored chunks of a history that moved on since (the
                                   daemon stopped between a turn's commit and the
                                   chunk's write): recomputed, not a fault */
    uint64_t write_failures;    /* background chunk batches that could not be written */
    uint64_t write_waits;       /* times a call, an eviction or a reclaim waited for one */
    double write_wait_ms;       /* summed over write_waits */
    uint64_t switch_ins;
    double switch_in_ms;        /* summed over switch_ins */
    double last_switch_in_ms;
    uint64_t window_slides;     /* sliding windows: slides, and the tokens they dropped */
    uint64_t window_dropped;
    uint64_t chunks_promoted;   /* compressed chunks recomputed to get wider codes */
    uint64_t calibrations;      /* layer calibrations measured (ctxcalib.c) */
} ctx_stats;

typedef struct ctxmgr ctxmgr;

/*
 * Loads every context of the store (histories and chunk records) with no resident KV,
 * after removing chunk files no record refers to. Chunks come from pool; runner
 * recomputes them (the caller keeps both alive). The cost models come from the store
 * (measured with ctx_profile when absent). NULL + err on failure.
 *
 * A context whose stored data is damaged (its row or a turn does not match its
 * checksum, turns missing, a window or generation defaults that do not fit: any
 * STORE_E_DAMAGED or value the loader refuses) does not fail the open: it is loaded
 * with its damage set, and an error line on stderr names it (app, id) and says why.
 * What fails the open is what concerns the whole store: a catalog that cannot be read
 * or listed, I/O errors, no memory.
 */
ctxmgr *ctx_open(store *s, kv_pool *pool, model_runner *runner, const model *m,
                 const ctx_policy *policy, char err[ERR_MAX]);

/* Whether a stored context belongs to a manager, by the generate model it names (NULL:
 * a context from before the registry). */
typedef bool (*ctx_owns_fn)(const char *model, void *arg);

/* ctx_open of only the contexts owns(model, owns_arg) accepts (owns NULL: all), so that
 * each generate model's manager holds its own. The chunk file collection it runs sees
 * every manager's records: no other manager of the store may have writes in flight
 * (ctx_flush_writes). */
ctxmgr *ctx_open_owned(store *s, kv_pool *pool, model_runner *runner, const model *m,
                       const ctx_policy *policy, ctx_owns_fn owns, void *owns_arg,
                       char err[ERR_MAX]);

/* Frees every context and its resident KV (the store stays open: the caller closes it). */
void ctx_close(ctxmgr *cm);

/* The policy in force, and changing it (benchmarks). */
const ctx_policy *ctx_get_policy(const ctxmgr *cm);
void ctx_set_policy(ctxmgr *cm, const ctx_policy *policy);

/* The context with this id when it belongs to app (uid, app), else NULL: another app's
 * context and a missing one look the same. */
ctx_entry *ctx_find(ctxmgr *cm, const char *id, uint32_t uid, const char *app);

/* The context with this id, whoever owns it (admin calls). */
ctx_entry *ctx_find_any(ctxmgr *cm, const char *id);

/* Contexts of one app, and of all apps; those of all apps that are damaged. */
int ctx_count_app(const ctxmgr *cm, uint32_t uid, const char *app);
int ctx_count(const ctxmgr *cm);
int ctx_count_damaged(const ctxmgr *cm);

/* The first context (oldest first), to walk with ->next. */
ctx_entry *ctx_first(ctxmgr *cm);

/* Creates a context with a fresh random id, in the store then in memory. */
int ctx_create(ctxmgr *cm, uint32_t uid, const char *app, const char *system_prompt,
               const Llms__GenerationParams *defaults, int64_t now_ms, ctx_entry **out,
               char err[ERR_MAX]);

/* Sets and persists c's overflow policy (at creation; contexts start with WINDOW). */
int ctx_set_overflow(ctxmgr *cm, ctx_entry *c, enum ctx_overflow overflow, char err[ERR_MAX]);

/* Sets and persists the generate model c belongs to (at creation). */
int ctx_set_model(ctxmgr *cm, ctx_entry *c, const char *model, char err[ERR_MAX]);

/* Drops c from memory only (its dirty chunks written first): the store keeps it for
 * another manager to open. c must not be busy; it is freed. */
void ctx_forget(ctxmgr *cm, ctx_entry *c);

/* Deletes a context (store, chunk files and memory); c is freed. */
int ctx_delete(ctxmgr *cm, ctx_entry *c, char err[ERR_MAX]);

/*
 * Records a finished turn: the user (or raw) message with the tokens it added and the
 * assistant reply with its tokens, in the store (one transaction) then in memory. On
 * failure nothing changes in memory. When the call's window slid (ctx_window_slide),
 * the tokens are still the whole turn and reply: the same transaction stores the new
 * window and deletes the chunk blobs after the sink, and the context's tokens become
 * the window the call ended with.
 */
int ctx_commit_turn(ctxmgr *cm, ctx_entry *c, const char *user_role, const char *user_text,
                    const int32_t *user_tokens, int n_user, const char *reply_text,
                    const int32_t *reply_tokens, int n_reply, int64_t now_ms,
                    char err[ERR_MAX]);

/*
 * Starts a call on c: locks its chunks, makes room for up to max_tokens tokens of
 * attention statistics, and brings every chunk of the history in (Load), so that the
 * sequence then holds exactly c->n_tokens entries. st (may be NULL) gets what the
 * switch-in did. -1 + err on failure (a damaged c among them), CTX_E_BUDGET when the
 * budget cannot hold the context; c is unlocked again on failure.
 */
int ctx_call_begin(ctxmgr *cm, ctx_entry *c, int max_tokens, ctx_load_stats *st,
                   char err[ERR_MAX]);

/*
 * Evaluates a batch on a context inside a call (model_forward on c->seq): claims the
 * memory the appended entries need first and accumulates the attention every entry
 * receives. The batch's positions must be contiguous and ascending. -1 + err, or
 * CTX_E_BUDGET.
 */
int ctx_forward(ctxmgr *cm, ctx_entry *c, const model_batch *b, char err[ERR_MAX]);

/* The parts of ctx_forward, for a step scheduler that evaluates many contexts in one
 * model_forward_batch: ctx_forward_check (the batch continues c, inside a call), then one
 * ctx_claim of the ctx_append_bytes of every sequence of the step, then the forward with
 * c->attn as the batch's attn_received, then ctx_forward_account(c, entries before, n). */
int ctx_forward_check(const ctx_entry *c, const model_batch *b, char err[ERR_MAX]);
void ctx_forward_account(ctxmgr *cm, ctx_entry *c, int from, int n);

/* A speculative step's rejected rows (daemon/sched/speculate.h): the entries from keep on
 * leave c's sequence and their attention statistics are cleared, so the rows written
 * there next start from nothing. What those rows gave earlier entries stays counted,
 * with the rows that gave it (a density is a ratio of like sums). */
void ctx_forward_unwind(ctx_entry *c, int keep);

/* Bytes of KV that appending n entries to seq allocates (0 when the last chunk has room),
 * in its pool's shape. */
size_t ctx_append_bytes(const kv_seq *seq, int n);

/* Claims the memory that appending n entries to seq (a sequence of this manager's pool
 * outside any context, e.g. a Complete's) takes. 0, -1 + err, or CTX_E_BUDGET. */
int ctx_claim_append(ctxmgr *cm, const kv_seq *seq, int n, char err[ERR_MAX]);

/*
 * Ends the call on c. committed: the turn is in the history, so the chunks' densities
 * are updated, full chunks get their precision and modified chunks are written to the
 * store (ahead-of-time swap-out). Otherwise the KV beyond the history is dropped, and the
 * history's partial last chunk when a squeeze compressed it (read back or recomputed at
 * the next call). Then c is unlocked and the budget enforced. A write failure leaves the
 * chunk dirty (it is written, or dropped and later recomputed, when reclaimed).
 */
void ctx_call_end(ctxmgr *cm, ctx_entry *c, bool committed);

/* Calls notify(arg) from the swap-out thread whenever a background write is done, so
 * that the worker comes round to ctx_collect_writes. Set before the first call. */
void ctx_set_write_notify(ctxmgr *cm, void (*notify)(void *arg), void *arg);

/* Commits the catalog rows of the background writes that are done (never blocks on the
 * disk beyond that commit). */
void ctx_collect_writes(ctxmgr *cm);

/* Waits for c's background writes and commits them. */
void ctx_wait_writes(ctxmgr *cm, ctx_entry *c);

/* Waits for every background write and commits them (shutdown, tests, benchmarks). */
void ctx_flush_writes(ctxmgr *cm);

/* Background writes queued or being written. */
int ctx_writes_pending(ctxmgr *cm);

/* Drops the context's resident KV (writing dirty chunks first); its stored chunks stay. */
void ctx_evict(ctxmgr *cm, ctx_entry *c);

/* Resident KV bytes of one context and of all (the pool's, Complete's included). */
size_t ctx_kv_bytes(const ctxmgr *cm, const ctx_entry *c);
size_t ctx_kv_bytes_total(const ctxmgr *cm);
int ctx_count_resident(const ctxmgr *cm);

/* Tokens of the history chunk i covers (16, or fewer for the tail). */
int ctx_chunk_n_tokens(const ctx_entry *c, int i);

/* The mean width of chunk i's codes over its layers (16 for f16): its resident copy's,
 * else its stored one's; 0 when neither is known. */
int ctx_chunk_bits(const ctx_entry *c, int i);

/* Whether any chunk of c is in the store. */
bool ctx_on_disk(const ctx_entry *c);

/* Reclaims unlocked chunks (LCTRU order) until the resident KV is at most the budget. */
void ctx_enforce_budget(ctxmgr *cm);

/* Reclaims unlocked chunks until at least bytes more fit under the budget. 0, or
 * CTX_E_BUDGET when they cannot (with err). */
int ctx_claim(ctxmgr *cm, size_t bytes, char err[ERR_MAX]);

/* The bytes of KV that fit under the budget beside the resident ones without reclaiming
 * anything (SIZE_MAX without a budget). */
size_t ctx_budget_room(const ctxmgr *cm);

/* The KV of pool (resident and spare buffers) counts against cm's budget from now on:
 * the draft model's, which lives apart from the generate model's but is part of the
 * same KV memory (kv_budget_mb). Reclaiming then makes room for both, and trims pool's
 * spare buffers when cm's own are not enough. NULL stops it. */
void ctx_budget_also_counts(ctxmgr *cm, kv_pool *pool);

/* KV of cm's pool held outside every context that reclaiming gives up before any
 * context's chunk (the scheduler's prompt cache: resumable prompts, worth less than an
 * app's context): shed(arg, bytes) frees about that many bytes of it, and returns what it
 * freed. NULL stops it. */
void ctx_set_shed(ctxmgr *cm, size_t (*shed)(void *arg, size_t bytes), void *arg);

/*
 * Under a KV budget that reclaiming cannot satisfy, a call may make its own KV smaller:
 * converts the full f16 chunks of seq (a busy context's or a Complete's) from chunk
 * `from` on to int8, unless the policy keeps f16 (CTX_COMPRESS_NONE). Returns the bytes
 * freed. The caller passes the chunks this call made: they are written with the turn
 * anyway, and those before keep what the store holds. Evicting them instead would not
 * help: every later row attends to every earlier chunk, so each would be faulted back at
 * the next step, and the whole prefix is resident during every forward.
 */
size_t ctx_squeeze(ctxmgr *cm, kv_seq *seq, int from);

/* Totals since ctx_open. */
const ctx_stats *ctx_get_stats(const ctxmgr *cm);

/* Whether the model's layers are calibrated: chunks get a precision per layer. */
bool ctx_layers_calibrated(const ctxmgr *cm);

/* Forwards left of a layer calibration waiting for idle time (ctxcalib.c); 0: none. */
int ctx_calib_forwards_left(const ctxmgr *cm);

/* Runs the next forward of the calibration waiting for idle time, if any, on the
 * manager's runner (the caller sets the runner's background mode and abort flag):
 * MODEL_ABORTED when the abort flag stopped it (it runs again next time), else 0 (a
 * calibration that fails or finds no room under the KV budget is dropped). */
int ctx_calib_idle_step(ctxmgr *cm);

/* The fitted cost models, and replacing them for this run (benchmarks, tests; the
 * correction factors go back to 1). */
ctx_cost ctx_get_cost(const ctxmgr *cm);
void ctx_set_cost(ctxmgr *cm, const ctx_cost *cost);

/* The models with their corrections and the observed / predicted record. */
void ctx_get_cost_report(const ctxmgr *cm, ctx_cost_report *out);

/*
 * Measures the cost models now, stores them for this model and uses them (corrections
 * reset). Every point is timed 3 to 7 times (as many as about 2 s allow), the runs of
 * different points interleaved so that a burst of load elsewhere hits one run of each
 * rather than every run of one, and the line is fitted to the medians. A fit whose
 * residual stays above 30% after 3 attempts is refused: -1 + err, models unchanged.
 */
int ctx_profile(ctxmgr *cm, ctx_cost *out, char err[ERR_MAX]);

/* ---- sliding window (ctxwindow.c) ---- */

/* The sink of c's window under a limit of limit tokens: c's own once it slid, else
 * want tokens (the system prompt's, at least 4 as StreamingLLM) rounded up to whole
 * chunks; at least one chunk and at most half the limit. */
int ctx_window_sink(const ctx_entry *c, int want, int limit);

/*
 * Slides c's window inside a call. hist holds the call's tokens (the context's window,
 * the turn, the reply so far: *n_hist of them) and the KV the first entries of them.
 * Keeps hist[0, sink) (sink = ctx_window_sink(c, sink_want, limit)) and the last
 * max((limit - sink) / 2, keep_min) tokens (at most limit - sink - 1, leaving room to
 * generate), drops the tokens between them from hist and the KV after the sink from
 * c's sequence: the caller evaluates hist[sink, *n_hist) again (at their new
 * positions). Accumulated attention moves with the kept tokens. Returns the tokens
 * dropped, 0 when the window cannot slide (nothing between the sink and the tokens to
 * keep).
 */
int ctx_window_slide(ctxmgr *cm, ctx_entry *c, int32_t *hist, int *n_hist, int limit,
                     int keep_min, int sink_want);

/* 128 random bits as 32 lowercase hex characters and a NUL. */
int ctx_new_id(char id[CTX_ID_LEN + 1], char err[ERR_MAX]);

#endif
