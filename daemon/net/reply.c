/*
 * reply.c — the worker's replies (see reply.h).
 */
#include "daemon/net/reply.h"

#include <stdio.h>

#include "daemon/reqlog.h"
#include "daemon/net/resp.h"
#include "engine/err.h"

void reply_send(outq *out, uint32_t max_bytes, uint64_t conn_id, const Llms__Response *r,
                bool droppable)
{
    uint8_t *buf;
    size_t len;
    if (resp_pack(r, max_bytes, &buf, &len) == 0)
        outq_push(out, conn_id, buf, len, droppable);
}

void reply_error_v(outq *out, uint32_t max_bytes, uint64_t conn_id, const Llms__Request *req,
                   Llms__ErrorCode code, const char *fmt, va_list ap)
{
    uint8_t *buf;
    size_t len;
    char msg[ERR_MAX + 128];
    vsnprintf(msg, sizeof msg, fmt, ap);
    reqlog_request(0, NULL, req->body_case, -1, -1, code, msg);
    if (resp_error(req->id, code, max_bytes, &buf, &len, "%s", msg) == 0)
        outq_push(out, conn_id, buf, len, false);
}

void reply_error(outq *out, uint32_t max_bytes, uint64_t conn_id, const Llms__Request *req,
                 Llms__ErrorCode code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    reply_error_v(out, max_bytes, conn_id, req, code, fmt, ap);
    va_end(ap);
}

void reply_ok(outq *out, uint32_t max_bytes, uint64_t conn_id, const Llms__Request *req)
{
    Llms__Empty e = LLMS__EMPTY__INIT;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = req->id;
    r.final = 1;
    r.body_case = LLMS__RESPONSE__BODY_OK;
    r.ok = &e;
    reply_send(out, max_bytes, conn_id, &r, false);
}
