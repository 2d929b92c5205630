/* speculate.c — draft tokens proposed, verified and taken (see speculate.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/sched/sched_internal.h"
#include "engine/model/lookup.h"

/* The longest rest after missed proposals: 2^5 = 32 steps. */
#define SPEC_REST_LOG2_MAX 5

struct spec_drafter {
    models_entry *me;      /* m, dec_r, dec_pool */
    ctxmgr *budget;        /* the target's, whose budget the draft KV counts against */
    int window;            /* tokens its runner holds: a generation's draft KV at most */
    int n_vocab;
    int max_streams;
    float *logits;         /* (max_streams, n_vocab) one out row per drafting generation */
    kv_seq **seqs;         /* (max_streams) */
    model_batch *batches;  /* (max_streams) */
    gen **gens;            /* (max_streams) the generations of a forward */
    int32_t *last_row;     /* (max_streams) the out row of each batch */
};

static const int32_t out_rows[SPEC_MAX_DRAFT + 1] = {
    0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16,
    17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

const int32_t *spec_out_rows(void)
{
    return out_rows;
}

unsigned spec_mode_of_setting(const char *speculate)
{
    return !strcmp(speculate, "lookup") ? SPEC_LOOKUP
           : !strcmp(speculate, "draft") ? SPEC_DRAFT
           : !strcmp(speculate, "both")  ? SPEC_LOOKUP | SPEC_DRAFT
                                         : 0;
}

static unsigned spec_mode_of_request(Llms__Speculation speculation)
{
    switch (speculation) {
    case LLMS__SPECULATION__SPECULATION_LOOKUP:
        return SPEC_LOOKUP;
    case LLMS__SPECULATION__SPECULATION_DRAFT:
        return SPEC_DRAFT;
    case LLMS__SPECULATION__SPECULATION_BOTH:
        return SPEC_LOOKUP | SPEC_DRAFT;
    default:
        return 0;
    }
}

unsigned spec_mode_of_params(const config *cfg, const Llms__GenerationParams *const *layers,
                             int n)
{
    if (cfg->speculate_rows == 0)
        return 0;
    unsigned mode = spec_mode_of_setting(cfg->speculate);
    for (int i = 0; i < n; i++)
        if (layers[i] && layers[i]->has_speculation)
            mode = spec_mode_of_request(layers[i]->speculation);
    return mode;
}

/* ---- the draft model ---- */

/* The most likely token (ties: the lowest id), as greedy sampling takes it. */
static int32_t argmax(const float *logits, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best])
            best = i;
    return best;
}

/* Forgets g's draft KV: the next proposal feeds the window's history again. */
static void draft_reset(gen *g)
{
    kv_seq_truncate(&g->draft_seq, 0);
    g->draft_base = g->draft_n = 0;
}

/* 0 when a and b have the same tokens; else -1 + err naming the first that differs. */
static int same_vocabulary(const tokenizer *a, const tokenizer *b, char err[ERR_MAX])
{
    int32_t n = tok_n_vocab(a);
    if (tok_n_vocab(b) != n)
        return err_set(err, "its vocabulary has %d tokens, the generate model's %d",
                       (int)tok_n_vocab(b), (int)n);
    for (int32_t i = 0; i < n; i++) {
        size_t la, lb;
        const char *ta = tok_token_text(a, i, &la), *tb = tok_token_text(b, i, &lb);
        if (la != lb || (la && memcmp(ta, tb, la) != 0))
            return err_set(err, "its token %d is '%.*s', the generate model's '%.*s'", (int)i,
                           (int)(lb < 32 ? lb : 32), tb, (int)(la < 32 ? la : 32), ta);
    }
    return 0;
}

/* Frees d's buffers and d (its model's running count is the caller's). */
static void drafter_release(spec_drafter *d)
{
    free(d->logits);
    free(d->seqs);
    free(d->batches);
    free(d->gens);
    free(d->last_row);
    free(d);
}

spec_drafter *spec_drafter_new(models *reg, const char *draft_model, const tokenizer *target,
                               int max_streams, ctxmgr *budget, char err[ERR_MAX])
{
    char why[ERR_MAX];
    models_entry *me = models_find(reg, draft_model);
    if (!me) {
        err_set(err, "draft_model: no model '%s' in the registry", draft_model);
        return NULL;
    }
    if (!(me->roles & MODELS_DRAFT) || !me->dec_r) {
        err_set(err, "draft_model: model '%s' has no draft role (give its model.%s line the "
                     "draft role)", draft_model, draft_model);
        return NULL;
    }
    if (same_vocabulary(target, me->embed_tok, why) < 0) {
        err_set(err, "draft_model '%s' cannot draft for the generate model: %s", draft_model,
                why);
        return NULL;
    }
    int window = model_runner_max_kv(me->dec_r);
    if (window < SPEC_MAX_DRAFT + 2) {
        err_set(err, "draft_model '%s' holds %d tokens: too few to draft (at least %d)",
                draft_model, window, SPEC_MAX_DRAFT + 2);
        return NULL;
    }
    spec_drafter *d = calloc(1, sizeof *d);
    if (!d) {
        err_set(err, "out of memory");
        return NULL;
    }
    d->me = me;
    d->budget = budget;
    d->window = window;
    d->n_vocab = model_hparams_of(me->m)->n_vocab;
    d->max_streams = max_streams;
    d->logits = malloc(sizeof *d->logits * (size_t)max_streams * (size_t)d->n_vocab);
    d->seqs = malloc(sizeof *d->seqs * (size_t)max_streams);
    d->batches = malloc(sizeof *d->batches * (size_t)max_streams);
    d->gens = malloc(sizeof *d->gens * (size_t)max_streams);
    d->last_row = malloc(sizeof *d->last_row * (size_t)max_streams);
    if (!d->logits || !d->seqs || !d->batches || !d->gens || !d->last_row) {
        drafter_release(d);
        err_set(err, "out of memory");
        return NULL;
    }
    /* counted as running while it drafts: the registry never frees it under us */
    me->running++;
    ctx_budget_also_counts(budget, me->dec_pool);
    return d;
}

void spec_drafter_free(spec_drafter *d)
{
    if (!d)
        return;
    ctx_budget_also_counts(d->budget, NULL);
    d->me->running--;
    drafter_release(d);
}

const kv_pool *spec_drafter_pool(const spec_drafter *d)
{
    return d->me->dec_pool;
}

size_t spec_drafter_kv_need(const spec_drafter *d, long tokens)
{
    long held = tokens + SPEC_MAX_DRAFT < d->window ? tokens + SPEC_MAX_DRAFT : d->window;
    /* its first entry may sit anywhere in a chunk: one more */
    size_t chunks = (size_t)(held + KV_CHUNK_TOKENS - 1) / KV_CHUNK_TOKENS + 1;
    return chunks * kv_chunk_data_bytes(kv_pool_shape(d->me->dec_pool), KV_F16);
}

bool spec_drafter_uses(const spec_drafter *d, const models_entry *e)
{
    return d && d->me == e;
}

/* ---- a generation's speculation ---- */

int spec_gen_init(gen *g, const config *cfg, unsigned mode, spec_drafter *d)
{
    int max = cfg->speculate_max < SPEC_MAX_DRAFT ? cfg->speculate_max : SPEC_MAX_DRAFT;
    if (!(g->spec_rows = malloc(sizeof *g->spec_rows * (size_t)(1 + max))))
        return -1;
    g->spec_mode = mode;
    g->spec_k = (max + 1) / 2;
    if ((mode & SPEC_DRAFT) && d) {
        g->drafter = d;
        kv_seq_init(&g->draft_seq, d->me->dec_pool);
    }
    return 0;
}

void spec_gen_free(gen *g)
{
    if (g->drafter)
        kv_seq_free(&g->draft_seq);
    free(g->spec_rows);
}

/* ---- whether speculation pays ---- */

#define SPEC_GATE_ALPHA 0.1   /* weight of the latest step in the moving averages */
#define SPEC_GATE_MIN_STEPS 8 /* steps of a kind measured before it is judged */
/* What the draft model's steps must yield over the alternative's: a 64-row catch-up of
 * a model a quarter of the target's size costs about 16 decode steps, a sixth of a
 * 96-token reply, and it is in no measurement. */
#define SPEC_GATE_DRAFT_MARGIN 1.25

static int gate_bucket(int n_decoding)
{
    return (n_decoding < SPEC_GATE_STREAMS ? n_decoding : SPEC_GATE_STREAMS) - 1;
}

/* The cells of one set of sources: (SPEC_ARMS, SPEC_GATE_STREAMS). */
typedef spec_gate_cell gate_table[SPEC_ARMS][SPEC_GATE_STREAMS];

/* Tokens a millisecond of arm's steps, or -1 when too few were measured. */
static double gate_rate(const gate_table *t, int b, enum spec_arm arm)
{
    const spec_gate_cell *a = &(*t)[arm][b];
    return a->n >= SPEC_GATE_MIN_STEPS && a->ms > 0 ? a->tokens / a->ms : -1;
}

/* Whether arm sits this step out. Slower than the alternative, it does but for probes;
 * faster, it runs but for probes of the alternative, so that both averages stay fresh
 * (a step's cost drifts with the contexts' lengths and the load). A probe is
 * SPEC_GATE_PROBE_STEPS steps in a row (the first of the draft model's may only catch
 * its KV up); the first comes SPEC_GATE_PROBE steps after the verdict, then each twice
 * as long after the last, up to SPEC_GATE_PROBE_MAX, until the verdict changes. */
static bool gate_sits_out(spec_gate_cell *c, bool slower, uint64_t step_no)
{
    if (c->probe_every == 0 || slower != c->slower) {
        c->slower = slower;
        c->probe_every = SPEC_GATE_PROBE;
        c->next_probe = step_no + SPEC_GATE_PROBE;
        c->probe_left = 0;
    }
    bool probe = false;
    if (c->probe_left > 0) {
        c->probe_left--;
        probe = true;
    } else if (step_no >= c->next_probe) {
        c->probe_left = SPEC_GATE_PROBE_STEPS - 1;
        if (c->probe_every < SPEC_GATE_PROBE_MAX)
            c->probe_every *= 2;
        c->next_probe = step_no + c->probe_every;
        probe = true;
    }
    return slower != probe;
}

/* The bucket nearest to b (the next larger first) where arm and plain steps were both
 * measured, or -1. Decode at n streams pays much as at n + 1, and a count of decoding
 * streams whose decode-only steps are rare, as when one stream of several is
 * prefilling (such steps measure nothing), is judged by its neighbour's. */
static int gate_judged_bucket(const gate_table *t, int b, enum spec_arm arm)
{
    for (int dist = 0; dist < SPEC_GATE_STREAMS; dist++)
        for (int side = 1; side >= -1; side -= 2) {
            int c = b + side * dist;
            if ((dist == 0 && side < 0) || c < 0 || c >= SPEC_GATE_STREAMS)
                continue;
            if (gate_rate(t, c, arm) >= 0 && gate_rate(t, c, SPEC_ARM_PLAIN) >= 0)
                return c;
        }
    return -1;
}

/* Whether source arm sits this step of bucket b out: judged at the nearest bucket with
 * measurements (against best, the rate without it there, times margin); with none,
 * it runs to be measured, then sits out until the steps without it are. */
static bool gate_source_sits_out(gate_table *t, int b, enum spec_arm arm, unsigned modes,
                                 double margin, uint64_t step_no)
{
    int j = gate_judged_bucket(t, b, arm);
    if (j < 0)
        return gate_rate(t, b, arm) >= 0;
    double best = gate_rate(t, j, SPEC_ARM_PLAIN), lookup = gate_rate(t, j, SPEC_ARM_LOOKUP);
    if (arm == SPEC_ARM_DRAFT && (modes & SPEC_LOOKUP) && lookup > best)
        best = lookup;
    return gate_sits_out(&(*t)[arm][j], gate_rate(t, j, arm) < margin * best, step_no);
}

unsigned spec_gate_sources(spec_gate *g, int n_decoding, unsigned modes, uint64_t step_no)
{
    modes &= SPEC_LOOKUP | SPEC_DRAFT;
    unsigned out = modes;
    if (n_decoding < 1 || !modes)
        return out;
    gate_table *t = &g->arm[modes];
    int b = gate_bucket(n_decoding);
    if ((out & SPEC_LOOKUP) &&
        gate_source_sits_out(t, b, SPEC_ARM_LOOKUP, modes, 1.0, step_no))
        out &= ~(unsigned)SPEC_LOOKUP;
    /* the draft model is judged against what the generations would do without it, by a
     * margin that pays for its catch-ups, which no measurement holds */
    if ((out & SPEC_DRAFT) &&
        gate_source_sits_out(t, b, SPEC_ARM_DRAFT, modes, SPEC_GATE_DRAFT_MARGIN, step_no))
        out &= ~(unsigned)SPEC_DRAFT;
    return out;
}

void spec_gate_record(spec_gate *g, int n_decoding, unsigned modes, enum spec_arm arm,
                      int tokens, double ms)
{
    modes &= SPEC_LOOKUP | SPEC_DRAFT;
    if (n_decoding < 1 || !modes)
        return;
    spec_gate_cell *a = &g->arm[modes][arm][gate_bucket(n_decoding)];
    if (a->n == 0) {
        a->tokens = tokens;
        a->ms = ms;
    } else {
        a->tokens += SPEC_GATE_ALPHA * (tokens - a->tokens);
        a->ms += SPEC_GATE_ALPHA * (ms - a->ms);
    }
    a->n++;
}

/* ---- proposals ---- */

void spec_propose(gen *g, int cap, unsigned allowed)
{
    g->n_draft = 0;
    g->draft_want = 0;
    if (!g->spec_rows)
        return;
    if (g->spec_rest > 0) {
        g->spec_rest--;
        return;
    }
    if (cap > g->spec_k)
        cap = g->spec_k;
    /* every token a step may take stays inside the window (no slide mid-step) and
     * max_tokens (the reply's room) */
    if (cap > g->limit - g->n_hist - 2)
        cap = g->limit - g->n_hist - 2;
    if (cap > g->max_gen - g->n_gen - 1)
        cap = g->max_gen - g->n_gen - 1;
    if (cap <= 0)
        return;
    g->spec_rows[0] = g->hist[g->n_hist - 1];
    unsigned mode = g->spec_mode & allowed;
    if (mode & SPEC_LOOKUP) {
        g->n_draft = lookup_propose(g->hist, g->n_hist, cap, g->spec_rows + 1);
        g->draft_from = SPEC_LOOKUP;
    }
    if (g->n_draft == 0 && g->drafter && (mode & SPEC_DRAFT)) {
        /* a slide rewrote the history the draft KV was made of */
        if (g->draft_slides != g->slides) {
            draft_reset(g);
            g->draft_slides = g->slides;
        }
        g->draft_want = cap;
    }
}

/* Gets g's draft KV ready for this step's proposal: the batch of history tokens it has
 * not seen, its last row out. A draft KV further behind than SPEC_DRAFT_CONTEXT tokens
 * (a new generation's prompt, or a stream that did not draft for a while), or without
 * room for the history and the drafts in its window, starts again on the history's last
 * SPEC_DRAFT_CONTEXT tokens: a catch-up is always one forward, so the step it runs in
 * drafts too, and it costs at most SPEC_DRAFT_CONTEXT rows of the small model. */
static void catch_up(spec_drafter *d, gen *g, const int32_t *positions, model_batch *b,
                     int32_t *last_row)
{
    int context = SPEC_DRAFT_CONTEXT < d->window - g->draft_want - 1
                      ? SPEC_DRAFT_CONTEXT
                      : d->window - g->draft_want - 1;
    if (g->n_hist - g->draft_n > context ||
        g->n_hist + g->draft_want - g->draft_base >= d->window) {
        g->draft_base = g->n_hist > context ? g->n_hist - context : 0;
        g->draft_n = g->draft_base;
        kv_seq_truncate(&g->draft_seq, 0);
    }
    int n = g->n_hist - g->draft_n;
    *last_row = n - 1;
    *b = (model_batch){.n_tokens = n, .tokens = g->hist + g->draft_n,
                       .positions = positions + (g->draft_n - g->draft_base),
                       .n_out = 1, .out_rows = last_row};
}

int spec_draft_all(spec_drafter *d, gen *const *gens, int n, const int32_t *positions,
                   bool *caught_up, char err[ERR_MAX])
{
    /* first forward: each drafting generation's unseen history, its last row out */
    int m = 0;
    size_t bytes = 0;
    *caught_up = false;
    for (int i = 0; i < n && m < d->max_streams; i++) {
        gen *g = gens[i];
        if (!g->draft_want)
            continue;
        d->gens[m] = g;
        d->seqs[m] = &g->draft_seq;
        catch_up(d, g, positions, &d->batches[m], &d->last_row[m]);
        d->batches[m].logits = d->logits + (size_t)m * d->n_vocab;
        *caught_up |= d->batches[m].n_tokens > SPEC_STEADY_ROWS;
        /* the history, then every draft but the last */
        bytes += ctx_append_bytes(&g->draft_seq, d->batches[m].n_tokens + g->draft_want - 1);
        m++;
    }
    if (m == 0)
        return 0;
    char why[ERR_MAX];
    if (ctx_claim(d->budget, bytes, why) != 0) {
        /* drafts are optional: the step decodes plainly */
        for (int i = 0; i < m; i++)
            d->gens[i]->draft_want = 0;
        *caught_up = false;
        return 0;
    }
    int rc = model_forward_batch(d->me->dec_r, m, d->seqs, d->batches, err);
    for (int i = 0; i < m; i++) {
        gen *g = d->gens[i];
        if (rc) {
            g->draft_want = 0;
            draft_reset(g);
        } else {
            g->draft_n += d->batches[i].n_tokens;
        }
    }
    if (rc)
        return -1;
    /* then one token per forward: each drafting generation's latest draft fed back */
    int k_max = 0;
    for (int i = 0; i < m; i++)
        if (d->gens[i]->draft_want > k_max)
            k_max = d->gens[i]->draft_want;
    for (int step = 1; step <= k_max; step++) {
        int b = 0;
        for (int i = 0; i < m; i++) {
            gen *g = d->gens[i];
            g->spec_rows[step] = argmax(d->logits + (size_t)i * d->n_vocab, d->n_vocab);
            if (step == g->draft_want)
                continue;
            d->seqs[b] = &g->draft_seq;
            d->batches[b] = (model_batch){
                .n_tokens = 1, .tokens = g->spec_rows + step,
                .positions = positions + (g->n_hist - 1 + step - g->draft_base),
                .n_out = 1, .out_rows = out_rows,
                .logits = d->logits + (size_t)b * d->n_vocab};
            b++;
        }
        /* the generations whose drafts are done leave; the others keep their order */
        int kept = 0;
        for (int i = 0; i < m; i++)
            if (d->gens[i]->draft_want > step)
                d->gens[kept++] = d->gens[i];
            else {
                gen *g = d->gens[i];
                g->n_draft = g->draft_want;
                g->draft_from = SPEC_DRAFT;
                g->draft_fed = g->draft_want - 1;
                g->draft_want = 0;
            }
        m = kept;
        if (b == 0)
            break;
        if (model_forward_batch(d->me->dec_r, b, d->seqs, d->batches, err)) {
            for (int i = 0; i < m; i++) {
                d->gens[i]->draft_want = 0;
                d->gens[i]->n_draft = 0;
                draft_reset(d->gens[i]);
            }
            return -1;
        }
    }
    return 1;
}

void spec_take(sched *s, work *w, const float *logits)
{
    gen *g = w->g;
    int k = g->n_draft, n_vocab = g->gm->n_vocab, taken = 0;
    /* the sequence holds the history but its last token, then the step's k + 1 rows */
    int kv_before = kv_seq_n_tokens(g->seq) - (k + 1), n_hist_before = g->n_hist;
    gen_note_token_time(s, g);
    /* each row's token is the one plain decoding samples there, from the same random
     * stream (a draft is so taken with its probability, as the rejection rule takes a
     * drafted token): a seeded sample is the same text with drafts or without, whichever
     * steps the gate gives them. JSON mode too: gen_sample draws among the tokens the
     * reply's state allows after the tokens taken before the row, and a rejected draft
     * never reached that state. */
    for (int i = 0; i <= k && !g->done; i++) {
        const float *row = logits + (size_t)i * n_vocab;
        int32_t t = gen_sample(g, row);
        bool match = i < k && t == g->spec_rows[i + 1];
        if (!gen_push_token(s, w, t, row) || !match)
            break;
        taken++;
    }
    /* the KV of the history but its last token: the rows up to the last accepted draft */
    int keep = kv_before + 1 + taken;
    if (g->c && g->seq == &g->c->seq)
        ctx_forward_unwind(g->c, keep);
    else if (kv_seq_n_tokens(g->seq) > keep)
        kv_seq_truncate(g->seq, keep);
    if (g->draft_from == SPEC_DRAFT) {
        /* the draft model fed the history and all drafts but the last: it keeps those
         * taken */
        int fed = taken < g->draft_fed ? taken : g->draft_fed;
        g->draft_n = n_hist_before + fed;
        kv_seq_truncate(&g->draft_seq, g->draft_n - g->draft_base);
    }
    int max = s->env.cfg->speculate_max < SPEC_MAX_DRAFT ? s->env.cfg->speculate_max
                                                          : SPEC_MAX_DRAFT;
    g->spec_k = taken == k ? (2 * k < max ? 2 * k : max) : taken + 1;
    /* text that does not repeat its context keeps proposing what is rejected, and a
     * rejected row costs its compute: each miss in a row doubles the rest before the
     * next proposal */
    g->spec_misses = taken ? 0 : g->spec_misses + 1;
    g->spec_rest = taken ? 0 : 1 << (g->spec_misses < SPEC_REST_LOG2_MAX ? g->spec_misses
                                                                         : SPEC_REST_LOG2_MAX);
    spec_counts *counts = g->draft_from == SPEC_DRAFT ? &s->spec_draft : &s->spec_lookup;
    counts->steps++;
    counts->proposed += (uint64_t)k;
    counts->accepted += (uint64_t)taken;
    g->n_draft = 0;
}
