/*
 * respsave.c — the Responses API's stored responses written to the store and deleted
 * from it for the gateway, which answers from its memory (daemon/net/respstore.h): the
 * jobs SCHED_RESPONSE_PUT and SCHED_RESPONSE_DELETE (sched.h). A write the store refuses
 * leaves the response in memory only, with a warning.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/reqlog.h"
#include "daemon/sched/sched_internal.h"

/* Copies n bytes of src to *at, NUL-terminated, and moves *at past them. */
static const char *copy_out(char **at, const void *src, size_t n)
{
    char *to = *at;
    memcpy(to, src, n);
    to[n] = '\0';
    *at += n + 1;
    return to;
}

sched_job *sched_response_job(enum sched_job_kind kind, const store_response *r)
{
    size_t id_len = strlen(r->id), prev_len = r->previous ? strlen(r->previous) : 0;
    size_t texts = kind == SCHED_RESPONSE_PUT ? r->response_len + r->items_len + 2 : 0;
    sched_job *j = sched_job_new(kind, 0);
    store_response *c = malloc(sizeof *c + id_len + prev_len + 2 + texts);
    if (!j || !c) {
        free(j);
        free(c);
        return NULL;
    }
    char *at = (char *)(c + 1);
    *c = (store_response){.uid = r->uid, .created = r->created, .bytes = r->bytes};
    c->id = copy_out(&at, r->id, id_len);
    c->previous = r->previous ? copy_out(&at, r->previous, prev_len) : NULL;
    if (texts) {
        c->response = copy_out(&at, r->response, r->response_len);
        c->response_len = r->response_len;
        c->items = copy_out(&at, r->items, r->items_len);
        c->items_len = r->items_len;
    }
    j->uid = r->uid;
    j->resp = c;
    return j;
}

void respsave_run(sched *s, const sched_job *j)
{
    char err[ERR_MAX];
    bool found;
    const store_response *r = j->resp;
    bool put = j->kind == SCHED_RESPONSE_PUT;
    int rc = put ? store_response_put(s->env.st, r, s->env.cfg->responses_store_bytes, err)
                 : store_response_delete(s->env.st, r->uid, r->id, &found, err);
    if (rc && reqlog_enabled(REQLOG_WARN))
        fprintf(stderr, "llmsd: warn: stored response %s: %s (%s)\n", r->id, err,
                put ? "kept in memory only, not after a restart"
                    : "deleted in memory, back after a restart");
}
