/*
 * speculate.h — speculative decoding in the step scheduler.
 *
 * Decode is at the memory wall: a step reads the weights once however many rows it
 * holds, so rows a step has to spare are nearly free. A generation with speculation on
 * (its params' speculation, else the `speculate` setting) proposes draft tokens before
 * each step: prompt lookup, the tokens that followed the latest earlier occurrence of
 * its last 2-4 tokens in its own history (engine/model/lookup.h). Its step row becomes
 * 1 + k rows: its last token, then the drafts; all k + 1 rows' logits come back. Each
 * row's token is then chosen as the sampler would (sampler_sample_draft: greedy is the
 * argmax, sampling accepts a draft with its probability and otherwise draws from the
 * rest, so the distribution is the sampler's), taken in order while it equals the
 * draft; the first that differs (or the row after the last draft) is taken too and ends
 * it. So a step yields 1 to k + 1 tokens, each exactly what plain decoding would have
 * taken (greedy: token for token). The KV entries of rejected drafts leave the sequence
 * (kv_seq_truncate: only the call's own f16 tail is touched; chunks before it are never
 * written by a step) and a context's attention statistics for those positions are
 * cleared.
 *
 * How many drafts: each generation's k adapts (all accepted: doubled up to
 * speculate_max; else one more than were accepted), and a step offers draft rows only
 * up to speculate_rows in all, shared by its decoding generations: one stream may
 * verify many, sixteen streams none, where the step is no longer bound by reading the
 * weights. k also stops short of the window's end and of max_tokens.
 */
#ifndef LLMS_SPECULATE_H
#define LLMS_SPECULATE_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/config.h"
#include "proto/llms.pb-c.h"

typedef struct gen gen;
typedef struct work work;
typedef struct sched sched;

/* Most draft rows one generation verifies in a step (speculate_max's bound). */
#define SPEC_MAX_DRAFT 32

/* Counts since the daemon started, per draft source. */
typedef struct spec_counts {
    uint64_t steps;     /* verifications: steps where a generation had drafts */
    uint64_t proposed;  /* draft tokens verified */
    uint64_t accepted;  /* of them taken */
} spec_counts;

/* Whether a generation with params p (merged: the request's over the context's, NULL
 * fields unset) speculates under cfg. */
bool spec_wanted(const config *cfg, const Llms__GenerationParams *ctx_p,
                 const Llms__GenerationParams *req_p);

/* Prepares g (speculation on) for drafting: its rows buffer. -1 when memory runs out. */
int spec_gen_init(gen *g, const config *cfg);

/* The drafts of decoding generation g for this step into its rows (row 0 its last
 * token), at most cap of them: their number, 0 for a plain decode row. */
int spec_propose(gen *g, int cap);

/* The out rows of a step's generation with n drafts: 0 .. n. */
const int32_t *spec_out_rows(void);

/* After the forward: takes the tokens w's n_draft + 1 rows of logits (each n_vocab, in
 * row order) decide, drops the KV of rejected drafts, adapts k and counts into counts. */
void spec_take(sched *s, work *w, const float *logits, spec_counts *counts);

#endif
