/*
 * sched.c — the worker: its thread, its loop, the replies, and the step scheduler that
 * advances every running request together.
 *
 * One cycle of the worker: take the inbox's jobs (light requests are answered at once),
 * drop cancelled and expired work, admit queued requests (one per app in turn), then run
 * one step. A step is one model_forward_batch over every sequence that has work: one
 * decode row for each generation past its prompt, plus slices of long work (prompt
 * prefills, Embed texts) shared out between apps by deficit round robin under
 * step_tokens rows; reranks advance on their own model by their share after the
 * forward. So the weights are read once per step for all streams, and a long request
 * delays the others by one slice per step, not by its whole length. Each generate model
 * has its own forward in the step (its runner, pool and contexts: genmodel.h); work on
 * one model never shares a forward with another's. The other files of daemon/sched/ are
 * named in sched_internal.h.
 */
#include "daemon/sched/sched.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/net/reply.h"
#include "daemon/reqlog.h"
#include "daemon/sched/sched_internal.h"

#define SCHED_MIN_QUANTUM 16  /* fewest rows of long work an app is offered per round */

/* One sequence of a step's forward. */
struct step_seq {
    work *w;
    kv_seq *seq;
    model_batch b;
    int from;              /* entries of the sequence before the step */
    int32_t last_row;      /* out row of a generation's batch */
    bool failed;
};

/* ---- replies ---- */

void sched_reply(sched *s, uint64_t conn_id, const Llms__Response *r, bool droppable)
{
    reply_send(&s->to, conn_id, r, droppable);
}

void sched_reply_error(sched *s, const sched_job *j, Llms__ErrorCode code, const char *fmt, ...)
{
    uint8_t *buf;
    size_t len;
    va_list ap;
    char msg[ERR_MAX + 128];
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    reqlog_request(j->uid, j->app, j->req->body_case, -1,
                   (double)(clock_mono_ns() - j->queued_ns) / 1e6, code, msg);
    if (reply_pack_error(j->req->id, code, s->to.max_bytes, &buf, &len, "%s", msg) == 0)
        outq_push(s->env.out, j->conn_id, buf, len, false, true);
}

void sched_reply_ok(sched *s, const sched_job *j)
{
    Llms__Empty e = LLMS__EMPTY__INIT;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = j->req->id;
    r.final = 1;
    r.body_case = LLMS__RESPONSE__BODY_OK;
    r.ok = &e;
    sched_reply(s, j->conn_id, &r, false);
}

void sched_job_free(sched_job *j)
{
    if (j) {
        if (j->req)
            llms__request__free_unpacked(j->req, NULL);
        free(j->resp);
        free(j);
    }
}

/* ---- steps ---- */

/* Adds rows [from, from + n) of a generation's history to the step; the last row's
 * logits are wanted when it is the last token of the history. */
static void step_add_gen(sched *s, int *n_seq, int *n_out, work *w, int from, int n)
{
    gen *g = w->g;
    step_seq *st = &s->steps[(*n_seq)++];
    *st = (step_seq){.w = w, .seq = g->seq, .from = from};
    st->b = (model_batch){.n_tokens = n, .tokens = g->hist + from,
                          .positions = s->positions + from};
    if (from + n == g->n_hist) {
        st->last_row = n - 1;
        st->b.n_out = 1;
        st->b.out_rows = &st->last_row;
        st->b.logits = g->gm->logits + (size_t)(*n_out)++ * g->gm->n_vocab;
    }
    if (g->c)
        st->b.attn_received = g->c->attn;
}

/* Adds a decoding generation's last token and its k drafts (speculate.h), every row's
 * logits wanted. */
static void step_add_drafts(sched *s, int *n_seq, int *n_out, work *w, int k)
{
    gen *g = w->g;
    int from = g->n_hist - 1;
    step_seq *st = &s->steps[(*n_seq)++];
    *st = (step_seq){.w = w, .seq = g->seq, .from = from};
    st->b = (model_batch){.n_tokens = k + 1, .tokens = g->spec_rows,
                          .positions = s->positions + from, .n_out = k + 1,
                          .out_rows = spec_out_rows(),
                          .logits = g->gm->logits + (size_t)*n_out * g->gm->n_vocab};
    *n_out += k + 1;
    if (g->c)
        st->b.attn_received = g->c->attn;
}

/* The KV the generations of the step's sequences [from, to) append. */
static size_t step_append_bytes(const sched *s, int from, int to)
{
    size_t total = 0;
    for (int i = from; i < to; i++)
        if (s->steps[i].w->g)
            total += ctx_append_bytes(s->steps[i].seq, s->steps[i].b.n_tokens);
    return total;
}

/* Claims KV memory under gm's budget for every generation's rows of the step's
 * sequences [from, to) (gm's), all together; when that does not fit, the step's
 * generations keep the full chunks they made in int8 (ctx_squeeze: a long prompt's KV
 * then exceeds the budget's f16 worth while its prefill goes on), and when it still does
 * not fit, one by one in step order, failing those that do not fit. */
static void step_claim(sched *s, genmodel *gm, int from, int to)
{
    char err[ERR_MAX];
    size_t total = step_append_bytes(s, from, to);
    if (total == 0 || ctx_claim(gm->cm, total, err) == 0)
        return;
    size_t freed = 0;
    for (int i = from; i < to; i++) {
        const gen *g = s->steps[i].w->g;
        if (g)
            freed += ctx_squeeze(gm->cm, g->seq,
                                 g->c && g->seq == &g->c->seq ? g->c->call_base / KV_CHUNK_TOKENS
                                                              : 0);
    }
    if (freed) {
        total = step_append_bytes(s, from, to);
        if (total == 0 || ctx_claim(gm->cm, total, err) == 0)
            return;
    }
    size_t claimed = 0;
    for (int i = from; i < to; i++) {
        step_seq *st = &s->steps[i];
        if (!st->w->g)
            continue;
        size_t bytes = ctx_append_bytes(st->seq, st->b.n_tokens);
        int rc = ctx_claim(gm->cm, claimed + bytes, err);
        if (rc == 0) {
            claimed += bytes;
            continue;
        }
        st->failed = true;
        work_fail(st->w, rc == CTX_E_BUDGET ? LLMS__ERROR_CODE__RESOURCE_EXHAUSTED
                                            : LLMS__ERROR_CODE__INTERNAL, err);
    }
}

/* Evaluates the step's sequences (those not failed) in one forward; when the batch
 * fails, each sequence alone, so that one bad sequence fails only its own work. True
 * when the forward stopped at the runner's abort flag (model_runner_set_abort): nothing
 * was computed, the sequences are as before. */
static bool step_forward(sched *s, genmodel *gm, int n_seq)
{
    char err[ERR_MAX];
    int n = 0;
    for (int i = 0; i < n_seq; i++)
        if (!s->steps[i].failed) {
            s->step_seqs[n] = s->steps[i].seq;
            s->step_batches[n++] = s->steps[i].b;
        }
    if (n == 0)
        return false;
    int rc = model_forward_batch(gm->runner, n, s->step_seqs, s->step_batches, err);
    if (rc == 0 || rc == MODEL_ABORTED)
        return rc == MODEL_ABORTED;
    for (int i = 0; i < n_seq; i++) {
        step_seq *st = &s->steps[i];
        if (st->failed || model_forward_batch(gm->runner, 1, &st->seq, &st->b, err) == 0)
            continue;
        st->failed = true;
        work_fail(st->w, LLMS__ERROR_CODE__INTERNAL, err);
    }
    return false;
}

/* What the forward produced: tokens for generations whose last row was evaluated,
 * attention statistics of contexts, pooled rows of Embed texts. */
static void step_collect(sched *s, int n_seq)
{
    for (int i = 0; i < n_seq; i++) {
        step_seq *st = &s->steps[i];
        work *w = st->w;
        if (st->failed)
            continue;
        if (!w->g) {
            /* a KbAdd's embedding ending is not its end: its write is the next slice */
            int done = semantic_slice_done(w->kt ? kb_task_embedding(w->kt) : w->t);
            w->answered |= !w->kt && done == 1;
            if (w->kt)
                kb_task_progress(w->kt);
            continue;
        }
        gen *g = w->g;
        if (g->c)
            ctx_forward_account(g->c->cm, g->c, st->from, st->b.n_tokens);
        if (!st->b.n_out)
            continue;
        if (!g->prefilled) {
            g->prefilled = true;
            g->t_first = clock_mono_ns();
            gen_prompt_evaluated(s, w);
        }
        g->refill = false;
        if (g->n_draft && st->b.tokens == g->spec_rows)
            spec_take(s, w, st->b.logits);
        else
            gen_take_token(s, w, st->b.logits);
    }
}

/* Gives long work a slice of take rows: a generation's switch-in and prompt rows, an
 * Embed's text rows (both added to the step), or a rerank's advance. Returns the rows
 * it took. */
static int step_add_long(sched *s, int *n_seq, int *n_out, work *w, int take)
{
    char err[ERR_MAX];
    sem_task *t = w->kt ? kb_task_embedding(w->kt) : w->t;
    if (w->kt && (!t || !semantic_uses_slices(t) || semantic_rows_left(t) == 0)) {
        w->answered = kb_task_advance(w->kt, take) == 1;
        return take;
    }
    if (t && !semantic_uses_slices(t)) {
        w->answered = semantic_advance(t, take) == 1;
        return take;
    }
    if (t) {
        step_seq *st = &s->steps[(*n_seq)++];
        *st = (step_seq){.w = w};
        semantic_slice(t, take, &st->seq, &st->b);
        return st->b.n_tokens;
    }
    gen *g = w->g;
    if (!g->switched_in && gen_switch_in(g, err)) {
        work_fail(w, g->err_code, err);
        return 0;
    }
    if (g->waited)
        gen_resume_after_wait(s, w);
    int from = kv_seq_n_tokens(g->seq);
    if (!g->prefilled && g->n_eval == 0)
        g->n_eval = g->n_hist - from;
    int n = g->n_hist - from < take ? g->n_hist - from : take;
    /* A RagQuery's prompt, from scratch or resumed after a cached prefix, is cut at the
     * same places, so each row goes through the same kernels and the reuse stays exact;
     * a Complete's at multiples of step_tokens, where the prompt cache's entries end
     * (promptcache.h), whether the cache is on or not (serial mode, which has none,
     * evaluates prompts whole). */
    int st = g->gm->step_tokens;
    int slice_end = g->rq                    ? rag_slice_end(g->rq, from, st)
                    : !g->c && !s->serial ? (from / st + 1) * st
                                          : from + n;
    if (n > slice_end - from)
        n = slice_end - from;
    step_add_gen(s, n_seq, n_out, w, from, n);
    return n;
}

/* Offers the step's long-work rows on gm to the apps that have long work there, deficit
 * round robin: each gets a quantum per round, spends it on its requests in arrival
 * order, and keeps what a full step left it for the next (each model keeps its own
 * deficits). */
static void step_share_long_work(sched *s, genmodel *gm, int *n_seq, int *n_out, int budget)
{
    int k = genset_slot(s, gm), n_apps = 0;
    for (app_state *a = s->apps; a; a = a->next) {
        bool has = false;
        for (int i = 0; i < s->n_active && !has; i++)
            has = s->active[i]->app == a && s->active[i]->gm == gm &&
                  work_is_long(s->active[i]);
        if (has)
            n_apps++;
        else
            a->deficit[k] = 0;
    }
    if (n_apps == 0)
        return;
    long quantum = budget / n_apps > SCHED_MIN_QUANTUM ? budget / n_apps : SCHED_MIN_QUANTUM;
    app_state *start = s->drr_next[k] ? s->drr_next[k] : s->apps;
    app_state *a = start;
    do {
        bool has = false;
        for (int i = 0; i < s->n_active && budget > 0; i++) {
            work *w = s->active[i];
            if (w->app != a || w->gm != gm || work_over(w, 0) || !work_is_long(w) ||
                (w->g && (w->g->done || gen_waits_for_shared_prompt(s, w))))
                continue;
            if (!has) {
                has = true;
                a->deficit[k] += quantum;
                if (a->deficit[k] > 2L * gm->step_tokens)
                    a->deficit[k] = 2L * gm->step_tokens;
            }
            long left = work_rows_left(w);
            long take = left < a->deficit[k] ? left : a->deficit[k];
            take = take < budget ? take : budget;
            if (take <= 0)
                break;
            int used = step_add_long(s, n_seq, n_out, w, (int)take);
            a->deficit[k] -= used;
            budget -= used;
        }
        a = a->next ? a->next : s->apps;
        if (budget <= 0) {
            s->drr_next[k] = a;
            break;
        }
    } while (a != start);
}

static void step_record(sched *s, int64_t t0, int rows)
{
    int64_t now = clock_mono_ns();
    s->stats[s->n_steps % SCHED_STATS] =
        (step_stat){.end_ns = now, .ms = (double)(now - t0) / 1e6, .rows = rows,
                    .stall_ms = s->step_stall_ms};
    s->n_steps++;
    s->step_stall_ms = 0;
}

static int step_rows(const sched *s, int n_seq)
{
    int rows = 0;
    for (int i = 0; i < n_seq; i++)
        rows += s->steps[i].failed ? 0 : s->steps[i].b.n_tokens;
    return rows;
}

static bool step_decodes(const work *w, const genmodel *gm)
{
    return w->gm == gm && w->g && gen_decoding(w->g) && !w->g->done && !work_over(w, 0);
}

/* One step on gm: a decode row for every generation past its prompt there (with the
 * drafts of those that speculate, in the rows the decode rows leave under
 * speculate_rows), the shared-out long work, one forward for all of it. */
static void run_step_on(sched *s, genmodel *gm)
{
    int64_t t0 = clock_mono_ns();
    int n_seq = 0, n_out = 0, n_decoding = 0;
    for (int i = 0; i < s->n_active; i++)
        n_decoding += step_decodes(s->active[i], gm);
    int spare = s->env.cfg->speculate_rows - n_decoding;
    int drafts_each = n_decoding && spare > 0 ? spare / n_decoding : 0;
    spec_gate *gate = &s->spec_gate[genset_slot(s, gm)];
    int n_gens = 0;
    unsigned modes = 0;
    for (int i = 0; i < s->n_active; i++)
        if (step_decodes(s->active[i], gm)) {
            gen *g = s->active[i]->g;
            s->spec_gen_tokens[n_gens] = g->n_gen;
            s->spec_gens[n_gens++] = g;
            modes |= g->spec_rows ? g->spec_mode : 0;
        }
    unsigned allowed = spec_gate_sources(gate, n_decoding, modes, s->n_steps);
    for (int i = 0; i < n_gens; i++)
        spec_propose(s->spec_gens[i], drafts_each, allowed);
    char err[ERR_MAX];
    bool caught_up = false;
    int drafted = s->drafter && gm == s->gm[0]
                      ? spec_draft_all(s->drafter, s->spec_gens, n_gens, s->positions,
                                       &caught_up, err)
                      : 0;
    if (drafted < 0 && reqlog_enabled(REQLOG_ERROR))
        fprintf(stderr, "llmsd: error: draft model: %s (the step decodes without its "
                        "drafts)\n", err);
    /* a step where the draft model ran is its kind, whatever came of it */
    enum spec_arm arm = drafted ? SPEC_ARM_DRAFT : SPEC_ARM_PLAIN;
    int decode_rows = 0;
    for (int i = 0; i < s->n_active; i++) {
        work *w = s->active[i];
        if (!step_decodes(w, gm))
            continue;
        int k = w->g->n_draft;
        if (k > 0) {
            step_add_drafts(s, &n_seq, &n_out, w, k);
            arm = w->g->draft_from == SPEC_DRAFT ? SPEC_ARM_DRAFT
                  : arm == SPEC_ARM_DRAFT        ? arm
                                                 : SPEC_ARM_LOOKUP;
        } else {
            step_add_gen(s, &n_seq, &n_out, w, w->g->n_hist - 1, 1);
        }
        decode_rows += 1 + k;
    }
    int decode_seqs = n_seq;
    step_share_long_work(s, gm, &n_seq, &n_out, gm->step_tokens);
    step_claim(s, gm, 0, n_seq);
    step_forward(s, gm, n_seq);
    step_collect(s, n_seq);
    if (n_seq) {
        int rows = step_rows(s, n_seq);
        /* a decode step alone says what its kind of step yields */
        if (n_seq == decode_seqs && rows == decode_rows && !caught_up) {
            int tokens = 0;
            for (int i = 0; i < n_gens; i++)
                tokens += s->spec_gens[i]->n_gen - s->spec_gen_tokens[i];
            spec_gate_record(gate, n_decoding, modes, arm, tokens,
                             (double)(clock_mono_ns() - t0) / 1e6);
        }
        step_record(s, t0, rows);
    }
}

/* Whether gm has decode rows this step, and nothing else: every generation running on
 * it decodes without drafts, and no long work waits there. */
static bool step_decode_only(const sched *s, const genmodel *gm, bool *decodes)
{
    *decodes = false;
    for (int i = 0; i < s->n_active; i++) {
        const work *w = s->active[i];
        if (w->gm != gm || work_over(w, 0))
            continue;
        if (work_is_long(w) || (w->g && w->g->spec_rows))
            return false;
        *decodes |= step_decodes(w, gm);
    }
    return true;
}

/*
 * One step for a base and its adapter models (daemon/models/models.h), when at least two
 * of them decode and none has other work: every decode row of all of them in one
 * forward on the base's runner, each row run as its own model (model_batch.model: its
 * adapters' deltas), so the base's weights are read once for all of them, as vLLM
 * batches requests of many adapters; each model's KV claimed under its own budget.
 * False, with nothing done, otherwise: the models then step one after another (prompts,
 * speculation and long work keep each model's own step).
 */
static bool run_step_shared(sched *s, genmodel *base)
{
    genmodel *members[SCHED_GEN_MAX];
    int n_members = 0;
    for (int k = 0; k < SCHED_GEN_MAX; k++) {
        genmodel *gm = s->gm[k];
        bool decodes;
        if (!gm || (gm != base && gm->me->base != base->me))
            continue;
        if (!step_decode_only(s, gm, &decodes))
            return false;
        if (decodes)
            members[n_members++] = gm;
    }
    if (n_members < 2)
        return false;
    int64_t t0 = clock_mono_ns();
    int n_seq = 0, n_out = 0;
    for (int m = 0; m < n_members; m++) {
        int from = n_seq;
        for (int i = 0; i < s->n_active; i++) {
            work *w = s->active[i];
            if (!step_decodes(w, members[m]))
                continue;
            step_add_gen(s, &n_seq, &n_out, w, w->g->n_hist - 1, 1);
            s->steps[n_seq - 1].b.model = members[m]->me->m;
        }
        step_claim(s, members[m], from, n_seq);
    }
    step_forward(s, base, n_seq);
    step_collect(s, n_seq);
    step_record(s, t0, step_rows(s, n_seq));
    s->shared_steps++;
    return true;
}

/* One step on every generate model that has work: each its own batched forward (its
 * weights, its KV), the models one after another; a base and its adapter models that
 * only decode share one (run_step_shared). */
static void run_step(sched *s)
{
    for (int k = 0; k < SCHED_GEN_MAX; k++) {
        genmodel *gm = s->gm[k];
        /* adapter models step with their base */
        if (!gm || gm->me->base || run_step_shared(s, gm))
            continue;
        run_step_on(s, gm);
        for (int j = 0; j < SCHED_GEN_MAX; j++)
            if (s->gm[j] && s->gm[j]->me->base == gm->me)
                run_step_on(s, s->gm[j]);
    }
}

int sched_step_alone(sched *s, work *w, int take, _Atomic bool *abort, model_pause *pause)
{
    char err[ERR_MAX];
    int64_t t0 = clock_mono_ns();
    int n_seq = 0, n_out = 0;
    if (w->g && gen_decoding(w->g))
        step_add_gen(s, &n_seq, &n_out, w, w->g->n_hist - 1, 1);
    else
        step_add_long(s, &n_seq, &n_out, w, take);
    step_claim(s, w->gm, 0, n_seq);
    /* idle-time work on one thread: a core stays free for a request that arrives, and
     * the pool's adaptation keeps what real steps taught it (with the cores all its own,
     * idle-time work made it share the real steps' jobs again, 5-6% slower on
     * TinyStories-656K in bench/rag) */
    if (abort) {
        model_runner_set_background(w->gm->runner, true);
        model_runner_set_abort(w->gm->runner, abort);
        if (pause && model_runner_set_pause(w->gm->runner, pause, err) < 0)
            pause = NULL; /* another model's: the forward starts over when stopped */
    }
    bool aborted = step_forward(s, w->gm, n_seq);
    if (abort) {
        if (pause)
            model_runner_set_pause(w->gm->runner, NULL, err);
        model_runner_set_abort(w->gm->runner, NULL);
        model_runner_set_background(w->gm->runner, false);
    }
    if (aborted)
        return -1;
    step_collect(s, n_seq);
    if (n_seq)
        step_record(s, t0, step_rows(s, n_seq));
    return n_seq;
}

/* sched = serial, the behaviour before the step scheduler: every request in turn gets its
 * own forward, and long work runs to completion. */
static void run_serial(sched *s)
{
    for (int i = 0; i < s->n_active; i++) {
        work *w = s->active[i];
        /* a graph between nodes, or whose node just finished, waits for graphrun_advance_all */
        while (!work_over(w, clock_mono_ns()) && (w->t || w->kt || (w->g && !w->g->done))) {
            sched_step_alone(s, w, w->gm->max_batch, NULL, NULL);
            if (w->g && gen_decoding(w->g))
                break; /* one token per generation per round */
        }
    }
}

int sched_step_room(sched *s, int rows)
{
    if (rows <= s->max_batch)
        return 0;
    step_seq *steps = realloc(s->steps, sizeof *steps * (size_t)rows);
    if (steps)
        s->steps = steps;
    kv_seq **seqs = realloc(s->step_seqs, sizeof *seqs * (size_t)rows);
    if (seqs)
        s->step_seqs = seqs;
    model_batch *batches = realloc(s->step_batches, sizeof *batches * (size_t)rows);
    if (batches)
        s->step_batches = batches;
    if (!steps || !seqs || !batches)
        return -1;
    s->max_batch = rows;
    return 0;
}

/* The swap-out thread wrote a batch: the worker commits it when it next comes round. */
void sched_writes_done(void *arg)
{
    sched *s = arg;
    pthread_mutex_lock(&s->lock);
    s->writes_done = true;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
}

/* ---- the worker ---- */

static void *worker(void *arg)
{
    sched *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        while (!s->in_head && s->n_active == 0 && s->n_pending == 0 && !s->shutting &&
               !s->writes_done) {
            int64_t wait = idle_wait_ns(s);
            if (wait == 0)
                break;
            if (wait < 0) {
                pthread_cond_wait(&s->wake, &s->lock);
                continue;
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            int64_t ns = ts.tv_nsec + wait % 1000000000;
            ts.tv_sec += (time_t)(wait / 1000000000 + ns / 1000000000);
            ts.tv_nsec = (long)(ns % 1000000000);
            pthread_cond_timedwait(&s->wake, &s->lock, &ts);
        }
        sched_job *j = s->in_head;
        s->in_head = s->in_tail = NULL;
        s->writes_done = false;
        pthread_mutex_unlock(&s->lock);
        for (int k = 0; k < SCHED_GEN_MAX; k++)
            if (s->gm[k])
                ctx_collect_writes(s->gm[k]->cm);
        while (j) {
            sched_job *next = j->next;
            admit_job(s, j);
            j = next;
        }
        outq_wake(s->env.out);
        admit_reap(s);
        admit_pending(s);
        graphrun_advance_all(s);
        if (s->serial)
            run_serial(s);
        else
            run_step(s);
        admit_reap(s);
        if (s->n_active || s->n_pending)
            s->last_req_ns = clock_mono_ns();
        idle_run(s);
        outq_wake(s->env.out);
        if (s->shutting && s->n_active == 0 && s->n_pending == 0)
            break;
    }
    if (s->pred)
        idle_pred_end(s, false);
    outq_push_end(s->env.out);
    return NULL;
}

/* ---- lifecycle ---- */

sched *sched_new(const sched_env *env, char err[ERR_MAX])
{
    sched *s = calloc(1, sizeof *s);
    if (!s) {
        err_set(err, "out of memory");
        return NULL;
    }
    s->env = *env;
    s->to = (reply_to){env->out, env->cfg->max_frame_bytes};
    const config *cfg = env->cfg;
    s->start_ms = clock_wall_ms();
    s->last_req_ns = clock_mono_ns();
    s->serial = strcmp(cfg->sched, "serial") == 0;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->wake, NULL);
    s->positions = malloc(sizeof *s->positions * (size_t)cfg->n_ctx);
    if (!s->positions) {
        err_set(err, "out of memory");
        goto fail;
    }
    for (int i = 0; i < cfg->n_ctx; i++)
        s->positions[i] = i;
    if (genset_start(s, err) < 0)
        goto fail;
    if (cfg->draft_model[0] &&
        !(s->drafter = spec_drafter_new(env->reg, cfg->draft_model, s->gm[0]->tok,
                                        SCHED_MAX_ACTIVE, s->gm[0]->cm, err)))
        goto fail;
    if ((spec_mode_of_setting(cfg->speculate) & SPEC_DRAFT) && !s->drafter) {
        err_set(err, "speculate = %s drafts with draft_model, which is not set",
                cfg->speculate);
        goto fail;
    }
    semantic_env se = {cfg, env->reg, env->m, env->tok, s->gm[0]->runner, s->gm[0]->pool,
                       s->gm[0]->max_batch, env->st, env->out};
    s->sem = semantic_new(&se, err);
    if (!s->sem)
        goto fail;
    kb_env ke = {cfg, env->st, env->out, env->tok, s->sem, env->reg};
    if (!(s->kb = kb_new(&ke, err)))
        goto fail;
    if (!(s->predict = predict_new(cfg, env->st, err)))
        goto fail;
    rag_env re = {cfg, models_generate(env->reg)->path, env->st, env->out, env->tok, env->family,
                  model_kv_shape(env->m), s->kb, s->sem, s->predict};
    if (!(s->rag = rag_new(&re, err)))
        goto fail;
    s->graphs = (graphs_env){cfg, env->st, env->out};
    return s;
fail:
    sched_free(s);
    return NULL;
}

int sched_start(sched *s, char err[ERR_MAX])
{
    int rc = pthread_create(&s->thread, NULL, worker, s);
    if (rc)
        return err_set(err, "pthread_create: %s", strerror(rc));
    s->started = true;
    return 0;
}

sched_job *sched_job_new(enum sched_job_kind kind, uint64_t conn_id)
{
    sched_job *j = calloc(1, sizeof *j);
    if (j) {
        j->kind = kind;
        j->conn_id = conn_id;
        j->queued_ns = clock_mono_ns();
    }
    return j;
}

void sched_submit(sched *s, sched_job *j)
{
    j->next = NULL;
    pthread_mutex_lock(&s->lock);
    if (s->in_tail)
        s->in_tail->next = j;
    else
        s->in_head = j;
    s->in_tail = j;
    if (!s->idle_shielded || admit_job_needs_engine(j))
        atomic_store(&s->idle_preempt, true);
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
}

void sched_set_connections(sched *s, unsigned n)
{
    atomic_store(&s->n_connections, n);
}

unsigned sched_n_contexts(const sched *s)
{
    return atomic_load(&((sched *)s)->n_contexts);
}

void sched_free(sched *s)
{
    if (!s)
        return;
    if (s->started)
        pthread_join(s->thread, NULL);
    for (int i = 0; i < s->n_active; i++)
        work_free(s->active[i]);
    admit_free(s);
    /* the responses that ended while the worker stopped are written now that the store
     * is this thread's */
    sched_job *j = s->in_head;
    while (j) {
        sched_job *next = j->next;
        if (j->resp)
            respsave_run(s, j);
        sched_job_free(j);
        j = next;
    }
    rag_free(s->rag);
    predict_free(s->predict);
    spec_drafter_free(s->drafter);
    kb_free(s->kb);
    semantic_free(s->sem);
    for (int k = 0; k < SCHED_GEN_MAX; k++) {
        pcache_free(s->pcache[k]); /* before its pool */
        genmodel_free(s->gm[k]);
    }
    free(s->positions);
    free(s->steps);
    free(s->step_seqs);
    free(s->step_batches);
    pthread_cond_destroy(&s->wake);
    pthread_mutex_destroy(&s->lock);
    free(s);
}
