/*
 * work.c — an admitted request (work): its start as a generation, a graph run, a
 * knowledge-base task or a semantic task; its failure; whether it is over; its end
 * (answered, counted off its app's queue, freed); what long work it has left.
 */
#include <stdio.h>
#include <stdlib.h>

#include "daemon/reqlog.h"
#include "daemon/sched/sched_internal.h"

/* Starts an admitted job on gm: a generation or a semantic task. NULL when the job was
 * answered instead (an error); the job is then freed. */
work *work_start(sched *s, genmodel *gm, sched_job *j, app_state *a, ctx_entry *c)
{
    work *w = calloc(1, sizeof *w);
    if (!w) {
        sched_reply_error(s, j, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        sched_job_free(j);
        return NULL;
    }
    w->job = j;
    w->app = a;
    w->gm = gm;
    w->deadline_ns = admit_job_deadline(j);
    Llms__Request__BodyCase body = j->req->body_case;
    if (body == LLMS__REQUEST__BODY_CALL || body == LLMS__REQUEST__BODY_COMPLETE ||
        body == LLMS__REQUEST__BODY_RAG_QUERY)
        w->g = gen_new(s, gm, j, c, NULL);
    else if (body == LLMS__REQUEST__BODY_GRAPH_RUN)
        w->gw = graphrun_new(s, j);
    else if (body == LLMS__REQUEST__BODY_KB_ADD || body == LLMS__REQUEST__BODY_KB_DROP)
        w->kt = kb_begin(s->kb, j->conn_id, j->uid, j->app, j->req);
    else
        w->t = semantic_begin(s->sem, j->conn_id, j->req);
    if (!w->g && !w->t && !w->gw && !w->kt) {
        work_free(w);
        return NULL;
    }
    return w;
}

void work_free(work *w)
{
    if (!w)
        return;
    gen_free(w->g);
    semantic_task_free(w->t);
    kb_task_free(w->kt);
    graphrun_free(w->gw);
    sched_job_free(w->job);
    free(w);
}

/* Marks the work failed; the next reap answers it and ends it. */
void work_fail(work *w, Llms__ErrorCode code, const char *msg)
{
    w->failed = true;
    w->fail_code = code;
    snprintf(w->fail_msg, sizeof w->fail_msg, "%s", msg);
    if (w->g) {
        w->g->err_code = code;
        w->g->done = true;
    }
}

/* Whether the work is over: finished, failed, cancelled or past its deadline. */
bool work_over(const work *w, int64_t now)
{
    bool expired = w->deadline_ns && now >= w->deadline_ns;
    if (w->failed || w->answered)
        return true;
    /* a graph's generation node ending is not the graph's end */
    return w->g && !w->gw ? w->g->done || w->cancelled || expired : w->cancelled || expired;
}

/* Ends an admitted request that is over: its answer (the result, the failure, or why it
 * stopped), and its place in the app's queue count. */
void work_end(sched *s, work *w)
{
    if (w->gw) {
        graphrun_end(s, w);
    } else if (w->g) {
        gen_end(s, w);
    } else if (w->answered) {
        reqlog_request(w->job->uid, w->job->app, w->job->req->body_case, -1,
                       (double)(clock_mono_ns() - w->job->queued_ns) / 1e6, LLMS__ERROR_CODE__OK,
                       "answered");
    } else if (!w->quiet) {
        if (w->failed)
            sched_reply_error(s, w->job, w->fail_code, "%s", w->fail_msg);
        else if (s->shutting)
            sched_reply_error(s, w->job, LLMS__ERROR_CODE__UNAVAILABLE,
                              "the daemon is shutting down");
        else if (!w->cancelled)
            sched_reply_error(s, w->job, LLMS__ERROR_CODE__DEADLINE_EXCEEDED,
                              "the request's timeout passed");
        else
            sched_reply_error(s, w->job, LLMS__ERROR_CODE__CANCELLED, "cancelled");
    }
    w->app->n_queued--;
    w->gm->kv_reserved -= w->kv_reserved;
    admit_app_reclaim(s, w->app);
    work_free(w);
}

/* Whether the work still has long work (switch-in, prompt, texts, reranking) rather than
 * at most one decode row per step. */
bool work_is_long(const work *w)
{
    if (w->kt)
        return true; /* until it is answered */
    if (!w->g && !w->t) /* a graph between generations */
        return false;
    return w->g ? !gen_decoding(w->g) : semantic_rows_left(w->t) > 0;
}

/* Rows of long work left: a generation's prompt tokens not yet evaluated. */
long work_rows_left(const work *w)
{
    if (w->kt)
        return kb_task_rows_left(w->kt);
    if (!w->g)
        return semantic_rows_left(w->t);
    int have = w->g->switched_in ? kv_seq_n_tokens(w->g->seq) : w->g->n_base;
    return w->g->n_hist - have;
}
