/*
 * resp.c — Response frames, with an oversized reply turned into an error rather than a
 * frame the client would refuse.
 */
#include "daemon/net/resp.h"

#include "engine/err.h"

#include <stdarg.h>
#include <stdio.h>

#include "proto/frame.h"

int resp_error(uint64_t id, Llms__ErrorCode code, uint32_t max_bytes, uint8_t **out,
               size_t *len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = resp_error_v(id, code, max_bytes, out, len, fmt, ap);
    va_end(ap);
    return rc;
}

int resp_error_v(uint64_t id, Llms__ErrorCode code, uint32_t max_bytes, uint8_t **out,
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

int resp_pack(const Llms__Response *resp, uint32_t max_bytes, uint8_t **out, size_t *len)
{
    if (frame_pack(&resp->base, max_bytes, out, len) == 0)
        return 0;
    size_t need = protobuf_c_message_get_packed_size(&resp->base);
    if (need <= max_bytes)
        return resp_error(resp->id, LLMS__ERROR_CODE__INTERNAL, max_bytes, out, len,
                          "out of memory for a reply of %zu bytes", need);
    return resp_error(resp->id, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED, max_bytes, out, len,
                      "reply of %zu bytes is larger than max_frame_bytes (%u)", need, max_bytes);
}
