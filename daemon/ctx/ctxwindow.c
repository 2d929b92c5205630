/*
 * ctxwindow.c — the sliding window of a context that outgrows its token limit
 * (StreamingLLM: attention sinks plus the most recent tokens).
 *
 * Positions: a chunk stores keys after RoPE at the absolute positions of its tokens, and
 * chunk i always covers tokens [16 i, 16 i + 16) of the window. A slide keeps the sink
 * chunks as they are (same tokens, same positions) and drops every chunk after them; the
 * kept recent tokens are evaluated again, at positions right after the sink, against
 * the sink. So the KV after a slide is what a fresh prefill of [sink, recent] gives (up
 * to the rounding of a batch of another shape, as any recompute), never a shifted
 * approximation, and positions stay below the limit.
 *
 * Every slide drops the tokens right after the sink, so the tokens the slides of one
 * call drop are one run: the first call_dropped tokens after the sink of [window before
 * the call, turn, reply]. That is all the commit needs: the store keeps the whole turn
 * and moves the window's end (sink + dropped) on, and the in-memory window is cut the
 * same way.
 */
#include <string.h>

#include "daemon/ctx/ctxmem.h"

#define WINDOW_MIN_SINK 4 /* StreamingLLM: four initial tokens hold the attention sink */

int ctx_window_sink(const ctx_entry *c, int want, int limit)
{
    if (c->window_sink > 0)
        return c->window_sink;
    if (want < WINDOW_MIN_SINK)
        want = WINDOW_MIN_SINK;
    int sink = ctx_n_chunks(want) * KV_CHUNK_TOKENS;
    int most = limit / 2 / KV_CHUNK_TOKENS * KV_CHUNK_TOKENS;
    if (sink > most)
        sink = most;
    return sink < KV_CHUNK_TOKENS ? KV_CHUNK_TOKENS : sink;
}

int ctx_window_slide(ctxmgr *cm, ctx_entry *c, int32_t *hist, int *n_hist, int limit,
                     int keep_min, int sink_want)
{
    int sink = c->call_sink ? c->call_sink : ctx_window_sink(c, sink_want, limit);
    int keep = (limit - sink) / 2;
    if (keep < keep_min)
        keep = keep_min;
    if (keep > limit - sink - 1)
        keep = limit - sink - 1;
    int n = *n_hist, drop = n - sink - keep;
    if (keep < 1 || drop <= 0)
        return 0;
    int n_kv = kv_seq_n_tokens(&c->seq);
    memmove(hist + sink, hist + sink + drop, sizeof *hist * (size_t)keep);
    *n_hist = sink + keep;
    kv_seq_truncate(&c->seq, n_kv < sink ? n_kv : sink);
    /* The kept tokens take their attention statistics along (their densities still
     * describe them); entries that had no KV yet have none. */
    int moved = n_kv - sink - drop;
    moved = moved < 0 ? 0 : moved > keep ? keep : moved;
    memmove(c->attn + sink, c->attn + sink + drop, sizeof *c->attn * (size_t)moved);
    memmove(c->rows + sink, c->rows + sink + drop, sizeof *c->rows * (size_t)moved);
    int end = n < c->cap_attn ? n : c->cap_attn;
    if (end > sink + moved) {
        memset(c->attn + sink + moved, 0, sizeof *c->attn * (size_t)(end - sink - moved));
        memset(c->rows + sink + moved, 0, sizeof *c->rows * (size_t)(end - sink - moved));
    }
    c->call_sink = sink;
    c->call_dropped += drop;
    c->call_slides++;
    cm->stats.window_slides++;
    cm->stats.window_dropped += (uint64_t)drop;
    return drop;
}

int ctx_window_load(ctx_entry *c, const store_window *w, char err[ERR_MAX])
{
    c->overflow = w->overflow == CTX_OVERFLOW_REFUSE ? CTX_OVERFLOW_REFUSE : CTX_OVERFLOW_WINDOW;
    c->window_slides = (uint64_t)w->slides;
    if (w->dropped == 0)
        return 0;
    /* The columns come from the state directory: each is bounded on its own before the
     * two are added, so that no value a damaged file holds moves tokens out of bounds. */
    if (w->sink <= 0 || w->sink % KV_CHUNK_TOKENS || w->dropped < 0 || w->sink > c->n_tokens ||
        w->dropped > c->n_tokens - w->sink)
        return err_set(err, "store: context %s: window (sink %lld, dropped %lld) does not fit "
                       "its %d tokens", c->id, (long long)w->sink, (long long)w->dropped,
                       c->n_tokens);
    int sink = (int)w->sink, drop = (int)w->dropped;
    memmove(c->tokens + sink, c->tokens + sink + drop,
            sizeof *c->tokens * (size_t)(c->n_tokens - sink - drop));
    c->n_tokens -= drop;
    c->window_sink = sink;
    c->window_dropped = w->dropped;
    return 0;
}

void ctx_window_call_end(ctx_entry *c, bool committed)
{
    int first = c->call_sink / KV_CHUNK_TOKENS;
    if (committed) {
        /* The commit deleted the stored chunks from the sink on: the new ones are
         * written like any modified chunk. */
        for (int i = first; i < c->n_map; i++) {
            c->map[i].disk_precision = -1;
            c->map[i].dirty = true;
        }
        return;
    }
    /* The history and the store are as before the call: the KV after the sink (of the
     * slid window) goes, and is read back or recomputed at the next call; the statistics
     * come back from the chunks' densities as after a restart. */
    if (kv_seq_n_tokens(&c->seq) > c->call_sink)
        kv_seq_truncate(&c->seq, c->call_sink);
    float rows = (float)c->cm->heads_layers * CTX_DENSITY_ROWS;
    for (int p = c->call_sink; p < c->cap_attn; p++) {
        int i = p / KV_CHUNK_TOKENS;
        bool in = p < c->n_tokens && i < c->n_map;
        c->attn[p] = in ? c->map[i].density * rows : 0;
        c->rows[p] = in ? rows : 0;
    }
}
