/*
 * reply.h — the worker's replies: a Response packed and queued for its connection, and
 * an error answered and logged as the request's outcome. Used by every module that
 * answers requests on the worker thread (sched, semantic, kb, rag).
 */
#ifndef LLMS_REPLY_H
#define LLMS_REPLY_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/net/outq.h"
#include "proto/llms.pb-c.h"

/*
 * Packs resp as a whole frame into a fresh buffer (*out, *len). A response larger than
 * max_bytes is replaced by a RESOURCE_EXHAUSTED error for the same id. Returns -1 only when
 * memory runs out.
 */
int resp_pack(const Llms__Response *resp, uint32_t max_bytes, uint8_t **out, size_t *len);

/* Packs a final error Response (code and printf-style message) for request id. */
int resp_error(uint64_t id, Llms__ErrorCode code, uint32_t max_bytes, uint8_t **out,
               size_t *len, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* The same with the message's arguments as a va_list. */
int resp_error_v(uint64_t id, Llms__ErrorCode code, uint32_t max_bytes, uint8_t **out,
                 size_t *len, const char *fmt, va_list ap) __attribute__((format(printf, 6, 0)));

/* Packs r (replaced by RESOURCE_EXHAUSTED past max_bytes) and queues it for conn_id;
 * droppable chunks may be dropped for a slow reader (outq.h). Out of memory drops it. */
void reply_send(outq *out, uint32_t max_bytes, uint64_t conn_id, const Llms__Response *r,
                bool droppable);

/* Answers req with a final Ok. */
void reply_ok(outq *out, uint32_t max_bytes, uint64_t conn_id, const Llms__Request *req);

/* Answers req with a final error (code, printf-style message) and logs it as the
 * request's outcome. */
void reply_error(outq *out, uint32_t max_bytes, uint64_t conn_id, const Llms__Request *req,
                 Llms__ErrorCode code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* The same with the message's arguments as a va_list. */
void reply_error_v(outq *out, uint32_t max_bytes, uint64_t conn_id, const Llms__Request *req,
                   Llms__ErrorCode code, const char *fmt, va_list ap)
    __attribute__((format(printf, 6, 0)));

#endif
