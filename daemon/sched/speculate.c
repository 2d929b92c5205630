/* speculate.c — draft tokens proposed, verified and taken (see speculate.h). */
#include <stdlib.h>

#include "daemon/sched/sched_internal.h"
#include "engine/model/lookup.h"

static const int32_t out_rows[SPEC_MAX_DRAFT + 1] = {
    0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16,
    17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

const int32_t *spec_out_rows(void)
{
    return out_rows;
}

int spec_gen_init(gen *g, const config *cfg)
{
    int max = cfg->speculate_max < SPEC_MAX_DRAFT ? cfg->speculate_max : SPEC_MAX_DRAFT;
    if (!(g->spec_rows = malloc(sizeof *g->spec_rows * (size_t)(1 + max))))
        return -1;
    g->spec_k = (max + 1) / 2;
    return 0;
}

int spec_propose(gen *g, int cap)
{
    g->n_draft = 0;
    if (!g->spec_rows)
        return 0;
    if (cap > g->spec_k)
        cap = g->spec_k;
    /* every token a step may take stays inside the window (no slide mid-step) and
     * max_tokens (the reply's room) */
    if (cap > g->limit - g->n_hist - 2)
        cap = g->limit - g->n_hist - 2;
    if (cap > g->max_gen - g->n_gen - 1)
        cap = g->max_gen - g->n_gen - 1;
    if (cap <= 0)
        return 0;
    int n = lookup_propose(g->hist, g->n_hist, cap, g->spec_rows + 1);
    if (n > 0)
        g->spec_rows[0] = g->hist[g->n_hist - 1];
    g->n_draft = n;
    return n;
}

void spec_take(sched *s, work *w, const float *logits, spec_counts *counts)
{
    gen *g = w->g;
    int k = g->n_draft, n_vocab = g->gm->n_vocab, taken = 0;
    /* the sequence holds the history but its last token, then the step's k + 1 rows */
    int kv_before = kv_seq_n_tokens(g->seq) - (k + 1);
    gen_note_token_time(s, g);
    for (int i = 0; i <= k && !g->done; i++) {
        const float *row = logits + (size_t)i * n_vocab;
        int32_t t = i < k ? sampler_sample_draft(g->smp, row, g->hist, g->n_hist,
                                                 g->spec_rows[i + 1])
                          : sampler_sample(g->smp, row, g->hist, g->n_hist);
        bool match = i < k && t == g->spec_rows[i + 1];
        if (!gen_push_token(s, w, t) || !match)
            break;
        taken++;
    }
    /* the KV of the history but its last token: the rows up to the last accepted draft */
    int keep = kv_before + 1 + taken;
    if (g->c && g->seq == &g->c->seq)
        ctx_forward_unwind(g->c, keep);
    else if (kv_seq_n_tokens(g->seq) > keep)
        kv_seq_truncate(g->seq, keep);
    int max = s->env.cfg->speculate_max < SPEC_MAX_DRAFT ? s->env.cfg->speculate_max
                                                          : SPEC_MAX_DRAFT;
    g->spec_k = taken == k ? (2 * k < max ? 2 * k : max) : taken + 1;
    counts->steps++;
    counts->proposed += (uint64_t)k;
    counts->accepted += (uint64_t)taken;
    g->n_draft = 0;
}
