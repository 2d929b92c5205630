/*
 * idle.c — idle-time work, run while no engine request is queued or running and none came
 * for idle_after_ms: layer calibration, a cut-short KbDrop's rows, IVF training and hot
 * copies, measuring the knowledge bases' bytes on disk, and prediction (predict.h), each
 * given up when a job comes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/sched/sched_internal.h"

/* Whether idle-time work may run: nothing real queued or running, and no engine request
 * for idle_after_ms. */
static bool sched_idle(const sched *s, int64_t now)
{
    return !s->shutting && s->n_active == 0 && s->n_pending == 0 &&
           now - s->last_req_ns >= (int64_t)s->env.cfg->idle_after_ms * 1000000;
}

static bool pred_idle(const sched *s, int64_t now)
{
    return predict_enabled(s->predict) && sched_idle(s, now);
}

/* Whether the queue is empty; then the preempt flag is lowered for idle-time work (a
 * job submitted from now on raises it again: any job, or for a forward only one that
 * needs the engine when the last idle-time forward was given up; work that keeps what
 * it did when it stops, such as IVF training, stops for any job). */
static bool idle_claim(sched *s, bool forward)
{
    pthread_mutex_lock(&s->lock);
    bool queued = s->in_head != NULL;
    if (!queued) {
        atomic_store(&s->idle_preempt, false);
        s->idle_shielded = forward && s->idle_given_up;
    }
    pthread_mutex_unlock(&s->lock);
    return !queued;
}

/* Whether one-off idle-time work (not prediction's) may run now: the daemon is idle, no
 * prediction task is half done, and the queue is empty (the preempt flag lowered). */
static bool idle_turn(sched *s, bool forward)
{
    return sched_idle(s, clock_mono_ns()) && !s->pred && idle_claim(s, forward);
}

/* The generate model with a layer calibration waiting for idle time, or NULL. */
static genmodel *calib_waiting(const sched *s)
{
    for (int k = 0; k < SCHED_GEN_MAX; k++)
        if (s->gm[k] && ctx_calib_forwards_left(s->gm[k]->cm) > 0)
            return s->gm[k];
    return NULL;
}

/* Refreshes the hot copies of the IVF lists searched since the last refresh while the
 * daemon is idle (a copy of up to kb_ivf_hot_mb); whether it did. */
static bool hot_run(sched *s)
{
    if (!kb_ivf_hot_stale(s->kb) || !idle_turn(s, false))
        return false;
    kb_ivf_refresh_hot(s->kb);
    return true;
}

/* Deletes a slice of the rows a cut-short KbDrop left (a cancelled drop, a crash)
 * while the daemon is idle, a step's rows of work; whether it did. */
static bool drop_run(sched *s)
{
    if (!kb_drop_pending(s->kb) || !idle_turn(s, false))
        return false;
    kb_drop_idle(s->kb, s->gm[0]->step_tokens);
    return true;
}

/* Builds an IVF index a knowledge base waits for while the daemon is idle, until it is
 * done or a job comes (the build goes on from there next time); whether it ran. */
static bool train_run(sched *s)
{
    if (!kb_ivf_train_pending(s->kb) || !idle_turn(s, false))
        return false;
    kb_ivf_train_idle(s->kb, &s->idle_preempt);
    return true;
}

/* Measures one more btree of the knowledge bases' bytes on disk while the daemon is
 * idle, after a write made the last measurement stale; whether it did. */
static bool disk_run(sched *s)
{
    if (!kb_disk_stale(s->kb) || !idle_turn(s, false))
        return false;
    kb_disk_measure_idle(s->kb);
    return true;
}

/* One forward of a layer calibration while the daemon is idle, on one thread and given
 * up at the next layer when a job comes (it runs again later); whether one ran. Before
 * prediction, which has a budget every idle period: a calibration happens once. */
static bool calib_run(sched *s)
{
    genmodel *gm = calib_waiting(s);
    if (!gm || !idle_turn(s, true))
        return false;
    model_runner_set_background(gm->runner, true);
    model_runner_set_abort(gm->runner, &s->idle_preempt);
    s->idle_given_up = ctx_calib_idle_step(gm->cm) == MODEL_ABORTED;
    model_runner_set_abort(gm->runner, NULL);
    model_runner_set_background(gm->runner, false);
    return true;
}

/* Ends the prediction work: what it computed goes to the caches and the predictor
 * (complete), or is dropped. */
void idle_pred_end(sched *s, bool complete)
{
    work *w = s->pred;
    gen *g = w->g;
    enum predict_end how = PREDICT_DROPPED;
    if (complete && !w->failed && g->prefilled && gen_flush(s, w)) {
        if (g->rq)
            rag_populate(s->rag, g->rq, g->seq, g->shown ? g->shown : "", g->reason, g->n_gen);
        how = PREDICT_RAN;
    }
    predict_done(s->predict, &s->pred_task, how, g->shown ? g->shown : "");
    predict_task_clear(&s->pred_task);
    genmodel *gm = w->gm;
    /* its sequence goes: a forward kept of it is wanted no more */
    if (gm->idle_pause)
        model_pause_clear(gm->idle_pause);
    gm->kv_reserved -= w->kv_reserved;
    gen_free(g);
    free(w);
    s->pred = NULL;
    s->pred_paused = false;
    ctx_enforce_budget(gm->cm);
}

/* Builds the request of the predictor's task t in the scheduler's own slots. */
static void pred_request(sched *s, const predict_task *t)
{
    sched_job *j = &s->pred_job;
    memset(j, 0, sizeof *j);
    j->kind = SCHED_REQUEST;
    j->uid = t->uid;
    snprintf(j->app, sizeof j->app, "%s", t->app);
    j->queued_ns = clock_mono_ns();
    j->req = &s->pred_req;
    llms__request__init(&s->pred_req);
    llms__generation_params__init(&s->pred_params);
    if (t->kind == PREDICT_QUERY || t->kind == PREDICT_WARM) {
        llms__rag_query_request__init(&s->pred_rag);
        s->pred_rag.kb = (char *)t->kb;
        s->pred_rag.question = t->text;
        /* decoded: the daemon's settings, as a real query without its own gets, so the
         * stored answer is the one it would get */
        if (!t->decode) {
            s->pred_params.has_max_tokens = 1;
            s->pred_params.max_tokens = 1;
            s->pred_rag.params = &s->pred_params;
        }
        s->pred_req.body_case = LLMS__REQUEST__BODY_RAG_QUERY;
        s->pred_req.rag_query = &s->pred_rag;
    } else {
        llms__complete_request__init(&s->pred_complete);
        s->pred_complete.prompt = t->text;
        s->pred_complete.has_chat = 1;
        s->pred_complete.chat = 1;
        s->pred_params.has_temperature = 1;
        s->pred_params.temperature = 0;
        s->pred_params.has_max_tokens = 1;
        s->pred_params.max_tokens = t->max_tokens;
        s->pred_complete.params = &s->pred_params;
        s->pred_req.body_case = LLMS__REQUEST__BODY_COMPLETE;
        s->pred_req.complete = &s->pred_complete;
    }
}

/* Starts the predictor's next task that has something to compute; false when none. */
static bool pred_start(sched *s)
{
    predict_task *t = &s->pred_task;
    while (predict_next(s->predict, rag_tau(s->rag), rag_qkv_room(s->rag), t)) {
        int64_t t0 = clock_mono_ns();
        pred_request(s, t);
        genmodel *gm = s->gm[0];
        size_t need = admit_kv_need(s, gm, &s->pred_job, NULL, NULL);
        work *w = admit_kv_fit(s, gm, &s->pred_job, need, t0) == ADMIT_KV_FITS
                      ? calloc(1, sizeof *w)
                      : NULL;
        if (!w) {
            /* no room now: real work holds the memory */
            predict_done(s->predict, t, PREDICT_DROPPED, NULL);
            predict_task_clear(t);
            return false;
        }
        w->job = &s->pred_job;
        w->gm = gm;
        w->quiet = true;
        s->pred_cached = false;
        w->g = gen_new(s, gm, &s->pred_job, NULL, NULL);
        predict_count_ms(s->predict, (double)(clock_mono_ns() - t0) / 1e6);
        if (!w->g) {
            free(w);
            predict_done(s->predict, t, s->pred_cached ? PREDICT_CACHED : PREDICT_DROPPED, NULL);
            predict_task_clear(t);
            continue;
        }
        w->kv_reserved = need;
        gm->kv_reserved += need;
        s->pred = w;
        return true;
    }
    return false;
}

/* The pause that keeps gm's idle-time forwards when a job stops them, made on first use;
 * NULL while it cannot be (memory): a stopped forward then starts over, as it would
 * without one, and the next step tries again. */
static model_pause *pred_pause_of(genmodel *gm)
{
    char err[ERR_MAX];
    int rows = gm->step_tokens < gm->max_batch ? gm->step_tokens : gm->max_batch;
    if (!gm->idle_pause)
        gm->idle_pause = model_pause_new(gm->runner, rows, err);
    return gm->idle_pause;
}

/* One step of prediction work while the daemon is idle: a slice of its prompt or one
 * token, alone in the forward. A job that comes meanwhile stops it after the layer it is
 * in, and it goes on from there next time (the pause keeps what it did): so a request
 * or a status poll waits one layer, and prediction loses nothing however often they
 * come. */
static void pred_run(sched *s)
{
    if (!pred_idle(s, clock_mono_ns()) || !idle_claim(s, true) || (!s->pred && !pred_start(s)))
        return;
    s->pred_paused = false;
    work *w = s->pred;
    model_pause *pause = pred_pause_of(w->gm);
    uint64_t resumed = pause ? model_pause_resumed(pause) : 0;
    int64_t t0 = clock_mono_ns();
    int n_seq = sched_step_alone(s, w, w->gm->step_tokens, &s->idle_preempt, pause);
    if (pause && model_pause_resumed(pause) > resumed)
        predict_count_resumed(s->predict);
    /* a stop the pause kept needs no shield from the next job: nothing is lost */
    s->idle_given_up = n_seq < 0 && !(pause && model_pause_layers(pause) > 0);
    if (n_seq < 0) {
        predict_count_ms(s->predict, (double)(clock_mono_ns() - t0) / 1e6);
        return;
    }
    if (n_seq)
        predict_count_step(s->predict, (double)(clock_mono_ns() - t0) / 1e6);
    if (work_over(w, clock_mono_ns()))
        idle_pred_end(s, true);
}

void idle_run(sched *s)
{
    if (!calib_run(s) && !drop_run(s) && !train_run(s) && !hot_run(s) && !disk_run(s))
        pred_run(s);
}

void idle_end(sched *s)
{
    s->last_req_ns = clock_mono_ns();
    s->idle_given_up = false;
    predict_idle_end(s->predict);
    if (s->pred && !s->pred_paused) {
        s->pred_paused = true;
        predict_count_preempted(s->predict);
    }
}

/* How long the worker may sleep before idle-time work is due: -1 until a job comes,
 * 0 none. */
int64_t idle_wait_ns(sched *s)
{
    bool pred_work = predict_enabled(s->predict) &&
                     (s->pred || predict_has_work(s->predict, rag_tau(s->rag),
                                                  rag_qkv_room(s->rag)));
    if (s->shutting || (!pred_work && !calib_waiting(s) && !kb_ivf_hot_stale(s->kb) &&
                        !kb_ivf_train_pending(s->kb) && !kb_drop_pending(s->kb)))
        return -1;
    int64_t left = s->last_req_ns + (int64_t)s->env.cfg->idle_after_ms * 1000000 - clock_mono_ns();
    return left > 0 ? left : 0;
}
