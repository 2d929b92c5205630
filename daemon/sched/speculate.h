/*
 * speculate.h — speculative decoding in the step scheduler.
 *
 * Decode is at the memory wall: a step reads the weights once however many rows it
 * holds, so rows a step has to spare cost little. A generation with speculation on
 * (its params' speculation, else the `speculate` setting) proposes draft tokens before
 * each step, from one of two sources:
 * - lookup: the tokens that followed the latest earlier occurrence of its last 2-4
 *   tokens in its own history (engine/model/lookup.h): free, and right where answers
 *   quote passages, code or the conversation;
 * - draft: the greedy continuation of a small model of the same vocabulary
 *   (`draft_model`, a registry model with the draft role), which keeps a KV sequence per
 *   generation over a window of the history's last tokens (its own context length),
 *   catches up with the tokens taken since its last proposal (one forward: further
 *   behind, it starts again on the last SPEC_DRAFT_CONTEXT tokens) and then drafts one
 *   token per forward, all drafting generations batched in each forward;
 * with both, lookup first and the draft model where lookup finds nothing. The step row
 * of the generation becomes 1 + k rows: its last token, then the drafts; all k + 1
 * rows' logits come back. Each row's token is then sampled as plain decoding samples it
 * (gen_sample: JSON mode's constrained draw too, from the state the row's earlier tokens
 * reached; from the same random stream: a draft is taken with its probability),
 * taken in order while it equals the draft; the first that differs (or the row after
 * the last draft) is taken too and ends it. So a step yields 1 to k + 1 tokens, each
 * what plain decoding would have taken (greedy, and sampling with a seed: token for
 * token). The KV
 * entries of rejected drafts leave the sequence (kv_seq_truncate: only the call's own
 * f16 tail is touched; chunks before it are never written by a step), a context's
 * attention statistics for those positions are cleared, and the draft model's KV keeps
 * only the drafts that were taken.
 *
 * How many drafts: each generation's k adapts (all accepted: doubled up to
 * speculate_max; else one more than were accepted), a proposal with none accepted
 * makes it rest 2, 4, ... up to 32 steps before the next (a row that is rejected costs
 * its compute, and text that does not repeat its context keeps missing), and a step
 * offers draft rows only up to speculate_rows in all, shared by its decoding
 * generations: one stream may verify many, sixteen streams none, where the step is no
 * longer bound by reading the weights. k also stops short of the window's end and of
 * max_tokens. Only the default generate model's generations draft with the draft model.
 *
 * Whether a source pays is measured, not assumed (spec_gate): a small model on a CPU is
 * compute-bound at a few rows, and a draft model costs forwards of its own. For each
 * set of sources the step's decoding generations may use, and each count of them (1 to
 * SPEC_GATE_STREAMS, more counted with the last), the scheduler keeps the tokens and the milliseconds of its decode steps (draft forwards
 * included; steps with prefill or embedding rows, and those where a draft KV caught up,
 * are left out: they measure a start, not drafting) as moving averages, by the kind of
 * step: plain, with lookup drafts, with the draft model's. A source whose steps yield
 * fewer tokens a millisecond than plain steps (the draft model's: than the better of
 * plain and, when the generations may use it, lookup; by a margin, as its catch-ups
 * are not measured) is left out but for probes that measure it again,
 * SPEC_GATE_PROBE_STEPS steps each: the first SPEC_GATE_PROBE steps after it was left
 * out, then twice as long each time, up to SPEC_GATE_PROBE_MAX steps (a draft model's
 * probe starts with the catch-up of every stream's draft KV); so where a source does
 * not pay, speculation costs little more than its probes. One that pays sits out
 * probes of the same rhythm, which measure the steps without it again; one measured
 * before the steps without it sits out until they are. A count of streams not yet
 * measured follows the nearest that was: under load, the steps where one stream
 * prefills and the others decode carry no measurement of their own.
 */
#ifndef LLMS_SPECULATE_H
#define LLMS_SPECULATE_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/config.h"
#include "daemon/ctx/ctxmgr.h"
#include "daemon/models/models.h"
#include "engine/err.h"
#include "engine/tok/tokenizer.h"
#include "proto/llms.pb-c.h"

typedef struct gen gen;
typedef struct work work;
typedef struct sched sched;

/* Most draft rows one generation verifies in a step (speculate_max's bound). */
#define SPEC_MAX_DRAFT 32
/* The history a generation's draft KV starts again from when it is further behind (a
 * new prompt, a stream that did not draft for a while): a catch-up is one forward of at
 * most this many rows, in the step that drafts. */
#define SPEC_DRAFT_CONTEXT 64
/* History rows a drafting generation feeds the draft model in a step of steady drafting
 * at most: the tokens of its last step and of a rest. More is a catch-up, whose step
 * spec_gate does not measure. */
#define SPEC_STEADY_ROWS (SPEC_MAX_DRAFT + 1)

/* Draft sources, as bits of a generation's mode. */
enum spec_source { SPEC_LOOKUP = 1, SPEC_DRAFT = 2 };

/* The kinds of decode step spec_gate measures. */
enum spec_arm { SPEC_ARM_PLAIN, SPEC_ARM_LOOKUP, SPEC_ARM_DRAFT, SPEC_ARMS };
#define SPEC_GATE_STREAMS 16
#define SPEC_GATE_PROBE 32
#define SPEC_GATE_PROBE_MAX 1024
#define SPEC_GATE_PROBE_STEPS 4

/* One kind of decode step at one stream count: moving averages of its steps. */
typedef struct spec_gate_cell {
    double tokens, ms;  /* exponential moving averages */
    unsigned n;         /* steps measured */
    bool slower;          /* the verdict: slower than the alternative */
    unsigned probe_every; /* steps between probes under that verdict (0: none yet) */
    uint64_t next_probe;  /* the step of the next probe */
    int probe_left;       /* steps of the probe under way still to run */
} spec_gate_cell;

/* Moving averages of decode steps' tokens and milliseconds by kind and stream count, for
 * each set of sources the decoding generations may use (enum spec_source bits): what
 * the draft model is judged against differs with them, and so each measures apart. */
typedef struct spec_gate {
    spec_gate_cell arm[(SPEC_LOOKUP | SPEC_DRAFT) + 1][SPEC_ARMS][SPEC_GATE_STREAMS];
} spec_gate;

/* Of modes (the sources the step's decoding generations may use, enum spec_source
 * bits), those that pay for a step of n_decoding streams, and those being probed at
 * step step_no. */
unsigned spec_gate_sources(spec_gate *g, int n_decoding, unsigned modes, uint64_t step_no);

/* A decode step of n_decoding streams whose sources were modes, of kind arm, made tokens
 * in ms. */
void spec_gate_record(spec_gate *g, int n_decoding, unsigned modes, enum spec_arm arm,
                      int tokens, double ms);

/* Counts since the daemon started, per draft source. */
typedef struct spec_counts {
    uint64_t steps;     /* verifications: steps where a generation had drafts */
    uint64_t proposed;  /* draft tokens verified */
    uint64_t accepted;  /* of them taken */
} spec_counts;

/* The draft sources of the `speculate` setting ("off", "lookup", "draft", "both"). */
unsigned spec_mode_of_setting(const char *speculate);

/* The draft sources a generation uses: the `speculate` setting, then the speculation of
 * each of the n params layers that sets one (a context's defaults, then the request's;
 * NULL ones skipped); none when speculate_rows leaves no row to draft into. */
unsigned spec_mode_of_params(const config *cfg, const Llms__GenerationParams *const *layers,
                             int n);

/* The draft model of the scheduler: its registry entry (runner and KV pool apart) and
 * the buffers of its batched forwards. */
typedef struct spec_drafter spec_drafter;

/* The drafter of draft_model (a registry model with the draft role) for the target's
 * tokenizer: NULL + err when it is missing, lacks the role, holds too few tokens to
 * draft, or its vocabulary differs from the target's (the first token that differs is
 * named). max_streams: generations drafting in one step at most. Its KV counts against
 * budget's (the target's context manager; ctx_budget_also_counts): each draft forward
 * claims its KV there first, and is left out when that cannot be had. */
spec_drafter *spec_drafter_new(models *reg, const char *draft_model, const tokenizer *target,
                               int max_streams, ctxmgr *budget, char err[ERR_MAX]);
void spec_drafter_free(spec_drafter *d);

/* The pool of d's KV (f16 chunks only). */
const kv_pool *spec_drafter_pool(const spec_drafter *d);

/* The most KV a generation whose history reaches tokens may hold in d's pool: admission
 * reserves it beside the target's. */
size_t spec_drafter_kv_need(const spec_drafter *d, long tokens);

/* Whether e is the drafter's model (which cannot be unloaded while it drafts). */
bool spec_drafter_uses(const spec_drafter *d, const models_entry *e);

/* Prepares g for speculation with sources mode (the draft source only with a drafter,
 * which d may be, NULL otherwise). -1 when memory runs out. */
int spec_gen_init(gen *g, const config *cfg, unsigned mode, spec_drafter *d);

/* Frees what spec_gen_init made (nothing when it made nothing). */
void spec_gen_free(gen *g);

/* Before a step: the drafts of decoding generation g (at most cap, from the sources
 * among allowed) by lookup into its rows (row 0 its last token), g->n_draft of them;
 * none, with g marked to ask the draft model (spec_draft_all), when lookup found none
 * and g drafts from it. */
void spec_propose(gen *g, int cap, unsigned allowed);

/* The draft model's drafts for every generation spec_propose marked among gens (n):
 * each gets its g->n_draft drafts. 1 when it ran a forward, with caught_up set when a
 * generation fed more than SPEC_STEADY_ROWS rows of history first; 0 when none was
 * marked, or the KV budget could not hold their draft KV (then none drafts); -1 + err
 * when a forward fails (the generations then decode plainly). */
int spec_draft_all(spec_drafter *d, gen *const *gens, int n, const int32_t *positions,
                   bool *caught_up, char err[ERR_MAX]);

/* The out rows of a step's generation with n drafts: 0 .. n. */
const int32_t *spec_out_rows(void);

/* After the forward: takes the tokens w's n_draft + 1 rows of logits (each n_vocab, in
 * row order) decide, drops the KV of rejected drafts (the draft model's too), adapts k
 * and counts into the scheduler's counters of the drafts' source. */
void spec_take(sched *s, work *w, const float *logits);

#endif
