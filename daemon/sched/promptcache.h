/*
 * promptcache.h — the KV of recent Complete prompts, kept to be resumed by the next
 * prompt of the same app that begins the same way (a chat client sends the whole
 * conversation every turn: without it a conversation of n turns prefills O(n²) tokens).
 *
 * One cache per generate model (its KV pool). An entry is one owner's (uid, app) prompt:
 * its token ids and a kv_seq holding exactly their KV, copied in from the generation that
 * computed it as soon as its prompt is evaluated (when the budget has the room free) or
 * moved in when it ends, and copied to the ones that resume it while the budget has room
 * (moved out when it has not). An entry is only ever given to its own owner.
 *
 * Exactness: an entry's length and a resumed prefix are multiples of align (the
 * scheduler's step_tokens, where a Complete's prompt slices end), so the resumed KV is
 * what the same prompt's own slices would have computed; only f16 chunks are kept (a
 * squeezed chunk would change the reply). The bytes held are capped (LRU eviction), and
 * the KV budget may take them back first of all (pcache_shed, the context manager's
 * reclaim hook), as they live in the same pool as the contexts' KV.
 *
 * Only the worker thread touches a cache.
 */
#ifndef LLMS_PROMPTCACHE_H
#define LLMS_PROMPTCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/kv/kv.h"

typedef struct pcache pcache;

/* What a cache did since it was made, and what it holds. */
typedef struct pcache_stats {
    uint64_t hits;          /* prompts that resumed an entry */
    uint64_t misses;        /* prompts that found none */
    uint64_t reused_tokens; /* prompt tokens the hits did not evaluate */
    size_t bytes;           /* held now: KV chunks, token ids, records */
    int entries;
} pcache_stats;

/* An empty cache of KV from pool holding at most max_bytes (0: it keeps nothing). NULL
 * when out of memory. */
pcache *pcache_new(kv_pool *pool, size_t max_bytes);

/* Gives every entry's KV back to the pool. NULL is fine. */
void pcache_free(pcache *pc);

/* Changes the cap, evicting least recently used entries over it. */
void pcache_set_max(pcache *pc, size_t max_bytes);

/* Grants bytes of new KV under the budget the cache's pool is held to (the context
 * manager's ctx_claim, which may shed this cache's other entries): 0, or -1 when there
 * is no room. */
typedef int (*pcache_claim_fn)(void *arg, size_t bytes);

/*
 * The owner's (uid, app) entry sharing the longest usable prefix with prompt (n tokens):
 * usable is the common prefix cut down to a multiple of align and to at most n - 1 (a
 * token is left to evaluate, whose logits the reply starts from). When that is at least
 * align, *seq (empty, of the cache's pool) gets the KV of that prefix and its length is
 * returned; else 0 and seq is untouched. The KV is copied when claim grants its bytes, so
 * that the entry stays for the owner's other prompts running at the same time (requests
 * sharing a system prompt); else the entry leaves the cache and its KV moves.
 */
int pcache_take(pcache *pc, uint32_t uid, const char *app, const int32_t *prompt, int n,
                int align, pcache_claim_fn claim, void *claim_arg, kv_seq *seq);

/*
 * Keeps seq's KV of the prompt tokens[0, n) (seq holds at least their n entries, more
 * after them) as the owner's entry: cut down to a multiple of align and to its leading
 * f16 chunks, moved in (seq is left empty) or given back to the pool when nothing is left
 * or memory for the record runs out. The owner's entries it extends or equals go; one
 * that extends it makes it go instead. Then least recently used entries go while the
 * cache is over its cap.
 */
void pcache_put(pcache *pc, uint32_t uid, const char *app, const int32_t *tokens, int n,
                int align, kv_seq *seq);

/*
 * Keeps a copy of seq's KV of the prompt tokens[0, n) as pcache_put keeps the KV itself,
 * while the generation that holds seq goes on (its prompt evaluated, its reply to come):
 * the owner's prompts that come meanwhile resume it. Nothing when the owner's entries
 * already hold that prefix, claim refuses the bytes, or memory runs out.
 */
void pcache_put_copy(pcache *pc, uint32_t uid, const char *app, const int32_t *tokens, int n,
                     int align, const kv_seq *seq, pcache_claim_fn claim, void *claim_arg);

/* Evicts least recently used entries until bytes are freed or none is left; returns the
 * bytes freed. arg is the cache (the shape of ctx_set_shed's hook). */
size_t pcache_shed(void *arg, size_t bytes);

pcache_stats pcache_get_stats(const pcache *pc);

#endif
