/*
 * reply.c — Response frames, with an oversized reply turned into an error rather than a
 * frame the client would refuse, and the worker's replies through its outq (reply.h).
 */
#include "daemon/net/reply.h"

#include <stdarg.h>
#include <stdio.h>

#include "daemon/reqlog.h"
#include "engine/err.h"
#include "proto/frame.h"

int reply_pack_error(uint64_t id, Llms__ErrorCode code, uint32_t max_bytes, uint8_t **out,
                     size_t *len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = reply_pack_error_v(id, code, max_bytes, out, len, fmt, ap);
    va_end(ap);
    return rc;
}

int reply_pack_error_v(uint64_t id, Llms__ErrorCode code, uint32_t max_bytes, uint8_t **out,
                       size_t *len, const char *fmt, va_list ap)
{
    char msg[ERR_MAX + 128];
    vsnprintf(msg, sizeof msg, fmt, ap);
    Llms__Error e = LLMS__ERROR__INIT;
    e.code = code;
    e.message = msg;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = id;
    r.final = 1;
    r.error = &e;
    return frame_pack(&r.base, max_bytes, out, len);
}

int reply_pack(const Llms__Response *resp, uint32_t max_bytes, uint8_t **out, size_t *len)
{
    if (frame_pack(&resp->base, max_bytes, out, len) == 0)
        return 0;
    size_t need = protobuf_c_message_get_packed_size(&resp->base);
    if (need <= max_bytes)
        return reply_pack_error(resp->id, LLMS__ERROR_CODE__INTERNAL, max_bytes, out, len,
                                "out of memory for a reply of %zu bytes", need);
    return reply_pack_error(resp->id, LLMS__ERROR_CODE__INVALID_ARGUMENT, max_bytes, out,
                            len, "reply of %zu bytes is larger than max_frame_bytes (%u)", need,
                            max_bytes);
}

void reply_send(const reply_to *to, uint64_t conn_id, const Llms__Response *r, bool droppable)
{
    uint8_t *buf;
    size_t len;
    if (reply_pack(r, to->max_bytes, &buf, &len) == 0)
        outq_push(to->out, conn_id, buf, len, droppable, r->final);
}

void reply_error(const reply_to *to, uint64_t conn_id, const Llms__Request *req,
                 Llms__ErrorCode code, const char *fmt, ...)
{
    uint8_t *buf;
    size_t len;
    char msg[ERR_MAX + 128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    reqlog_request(0, NULL, req->body_case, -1, -1, code, msg);
    if (reply_pack_error(req->id, code, to->max_bytes, &buf, &len, "%s", msg) == 0)
        outq_push(to->out, conn_id, buf, len, false, true);
}

void reply_ok(const reply_to *to, uint64_t conn_id, const Llms__Request *req)
{
    Llms__Empty e = LLMS__EMPTY__INIT;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = req->id;
    r.final = 1;
    r.body_case = LLMS__RESPONSE__BODY_OK;
    r.ok = &e;
    reply_send(to, conn_id, &r, false);
}
