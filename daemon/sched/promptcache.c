/*
 * promptcache.c — the KV of recent Complete prompts per owner, resumed by the same
 * owner's next prompt that begins the same way (promptcache.h).
 *
 * Entries sit in one list, most recently used first (put, or taken: a copied entry goes
 * back to the head), so the tail is the least recently used. A cache holds a few entries
 * per app at most (each put drops what it extends), so the scans stay short.
 */
#include "daemon/sched/promptcache.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/sched/sched.h"

typedef struct pcache_entry {
    uint32_t uid;
    char app[SCHED_APP_MAX + 1];
    int32_t *tokens;       /* (n) the prompt tokens whose KV seq holds */
    int n;
    kv_seq seq;            /* exactly n entries, f16 */
    size_t bytes;          /* its chunks, tokens and record */
    struct pcache_entry *next;
} pcache_entry;

struct pcache {
    kv_pool *pool;
    size_t max_bytes;
    pcache_stats stats;
    pcache_entry *head;    /* most recently put first */
};

pcache *pcache_new(kv_pool *pool, size_t max_bytes)
{
    pcache *pc = calloc(1, sizeof *pc);
    if (pc) {
        pc->pool = pool;
        pc->max_bytes = max_bytes;
    }
    return pc;
}

static void entry_free(pcache_entry *e)
{
    kv_seq_free(&e->seq);
    free(e->tokens);
    free(e);
}

void pcache_free(pcache *pc)
{
    if (!pc)
        return;
    for (pcache_entry *e = pc->head, *next; e; e = next) {
        next = e->next;
        entry_free(e);
    }
    free(pc);
}

/* Unlinks *pp's entry from the list and from the counts (the caller frees or keeps it). */
static pcache_entry *unlink_at(pcache *pc, pcache_entry **pp)
{
    pcache_entry *e = *pp;
    *pp = e->next;
    e->next = NULL;
    pc->stats.bytes -= e->bytes;
    pc->stats.entries--;
    return e;
}

/* Links e first (the most recently used) and into the counts. */
static void link_first(pcache *pc, pcache_entry *e)
{
    e->next = pc->head;
    pc->head = e;
    pc->stats.bytes += e->bytes;
    pc->stats.entries++;
}

/* Frees the least recently used entry; its bytes, 0 when the cache is empty. */
static size_t evict_last(pcache *pc)
{
    if (!pc->head)
        return 0;
    pcache_entry **pp = &pc->head;
    while ((*pp)->next)
        pp = &(*pp)->next;
    pcache_entry *e = unlink_at(pc, pp);
    size_t bytes = e->bytes;
    entry_free(e);
    return bytes;
}

static void evict_over_cap(pcache *pc)
{
    while (pc->stats.bytes > pc->max_bytes && evict_last(pc))
        ;
}

void pcache_set_max(pcache *pc, size_t max_bytes)
{
    pc->max_bytes = max_bytes;
    evict_over_cap(pc);
}

size_t pcache_shed(void *arg, size_t bytes)
{
    pcache *pc = arg;
    size_t freed = 0, one;
    while (freed < bytes && (one = evict_last(pc)))
        freed += one;
    return freed;
}

static bool same_owner(const pcache_entry *e, uint32_t uid, const char *app)
{
    return e->uid == uid && strcmp(e->app, app) == 0;
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb)
{
    int i = 0;
    while (i < na && i < nb && a[i] == b[i])
        i++;
    return i;
}

int pcache_take(pcache *pc, uint32_t uid, const char *app, const int32_t *prompt, int n,
                int align, pcache_claim_fn claim, void *claim_arg, kv_seq *seq)
{
    pcache_entry **best = NULL;
    int best_n = 0;
    for (pcache_entry **pp = &pc->head; *pp; pp = &(*pp)->next) {
        if (!same_owner(*pp, uid, app))
            continue;
        int common = common_prefix((*pp)->tokens, (*pp)->n, prompt, n);
        if (common > n - 1)
            common = n - 1;
        int usable = common / align * align;
        if (usable > best_n) {
            best_n = usable;
            best = pp;
        }
    }
    if (best_n < align) {
        pc->stats.misses++;
        return 0;
    }
    /* out of the list while the claim runs: shedding must not free it */
    pcache_entry *e = unlink_at(pc, best);
    char err[ERR_MAX];
    if (claim && claim(claim_arg, kv_seq_prefix_bytes(&e->seq, best_n)) == 0 &&
        kv_seq_copy_prefix(seq, &e->seq, best_n, err) == 0) {
        link_first(pc, e);
    } else {
        kv_seq_free(seq); /* a copy cut short */
        kv_seq_truncate(&e->seq, best_n);
        *seq = e->seq;
        kv_seq_init(&e->seq, pc->pool);
        entry_free(e);
    }
    pc->stats.hits++;
    pc->stats.reused_tokens += (uint64_t)best_n;
    return best_n;
}

/* The entries of seq's first n that may be kept: its leading f16 chunks' (a chunk
 * squeezed to int8 under the KV budget holds other values than a prefill computes). */
static int f16_prefix(const kv_seq *seq, int n)
{
    int have = 0;
    for (int i = 0; i < seq->n_chunks && have < n; i++) {
        const kv_chunk *c = seq->chunks[i];
        if (!c || c->precision != KV_F16)
            break;
        have += c->n_tokens;
    }
    return have < n ? have : n;
}

/* Whether one of the owner's entries holds the first keep tokens: it serves every prompt
 * an entry of them would. */
static bool held(const pcache *pc, uint32_t uid, const char *app, const int32_t *tokens,
                 int keep)
{
    for (const pcache_entry *o = pc->head; o; o = o->next)
        if (same_owner(o, uid, app) && o->n >= keep &&
            common_prefix(o->tokens, o->n, tokens, keep) == keep)
            return true;
    return false;
}

void pcache_put_copy(pcache *pc, uint32_t uid, const char *app, const int32_t *tokens, int n,
                     int align, const kv_seq *seq, pcache_claim_fn claim, void *claim_arg)
{
    int keep = f16_prefix(seq, n) / align * align;
    if (keep == 0 || pc->max_bytes == 0 || held(pc, uid, app, tokens, keep) ||
        claim(claim_arg, kv_seq_prefix_bytes(seq, keep)) != 0)
        return;
    char err[ERR_MAX];
    kv_seq copy;
    kv_seq_init(&copy, pc->pool);
    if (kv_seq_copy_prefix(&copy, seq, keep, err) == 0)
        pcache_put(pc, uid, app, tokens, keep, align, &copy);
    kv_seq_free(&copy);
}

void pcache_put(pcache *pc, uint32_t uid, const char *app, const int32_t *tokens, int n,
                int align, kv_seq *seq)
{
    int keep = f16_prefix(seq, n) / align * align;
    pcache_entry *e = NULL;
    if (keep > 0 && pc->max_bytes > 0 && !held(pc, uid, app, tokens, keep) &&
        (e = calloc(1, sizeof *e)) &&
        (e->tokens = malloc(sizeof *e->tokens * (size_t)keep))) {
        e->uid = uid;
        snprintf(e->app, sizeof e->app, "%s", app);
        memcpy(e->tokens, tokens, sizeof *e->tokens * (size_t)keep);
        e->n = keep;
        kv_seq_truncate(seq, keep);
        e->seq = *seq;
        kv_seq_init(seq, pc->pool);
        e->bytes = kv_seq_prefix_bytes(&e->seq, keep) + sizeof *e->tokens * (size_t)keep +
                   sizeof *e;
        for (pcache_entry **pp = &pc->head; *pp;) {
            if (same_owner(*pp, uid, app) && (*pp)->n <= keep &&
                common_prefix((*pp)->tokens, (*pp)->n, tokens, keep) == (*pp)->n)
                entry_free(unlink_at(pc, pp));
            else
                pp = &(*pp)->next;
        }
        link_first(pc, e);
        evict_over_cap(pc);
        return;
    }
    free(e);
    kv_seq_free(seq);
}

pcache_stats pcache_get_stats(const pcache *pc)
{
    return pc->stats;
}
