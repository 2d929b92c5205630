/*
 * reply.h — Responses packed as frames, and the worker's replies: a Response packed and
 * queued for its connection, an error answered and logged as the request's outcome.
 * The loop packs its own answers with reply_pack / reply_pack_error and hands them to
 * the connection; the modules that answer requests on the worker thread (sched,
 * semantic, kb, rag, graphs) keep a reply_to and answer through it.
 */
#ifndef LLMS_REPLY_H
#define LLMS_REPLY_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/net/outq.h"
#include "proto/llms.pb-c.h"

/* Where the worker's replies go: the queue to the loop, and the largest frame a reply
 * may be (the config's max_frame_bytes). A value: each module keeps its own copy. */
typedef struct reply_to {
    outq *out;
    uint32_t max_bytes;
} reply_to;

/*
 * Packs resp as a whole frame into a fresh buffer (*out, *len). A response larger than
 * max_bytes is replaced by an INVALID_ARGUMENT error for the same id. Returns -1 only when
 * memory runs out.
 */
int reply_pack(const Llms__Response *resp, uint32_t max_bytes, uint8_t **out, size_t *len);

/* Packs a final error Response (code and printf-style message) for request id. -1 only
 * when memory runs out. */
int reply_pack_error(uint64_t id, Llms__ErrorCode code, uint32_t max_bytes, uint8_t **out,
                     size_t *len, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* The same with the message's arguments as a va_list. */
int reply_pack_error_v(uint64_t id, Llms__ErrorCode code, uint32_t max_bytes, uint8_t **out,
                       size_t *len, const char *fmt, va_list ap)
    __attribute__((format(printf, 6, 0)));

/* Packs r (reply_pack) and queues it for conn_id; droppable chunks may be dropped for a
 * slow reader (outq.h). Out of memory drops it. */
void reply_send(const reply_to *to, uint64_t conn_id, const Llms__Response *r, bool droppable);

/* Answers req with a final Ok. */
void reply_ok(const reply_to *to, uint64_t conn_id, const Llms__Request *req);

/* Answers req with a final error (code, printf-style message) and logs it as the
 * request's outcome. */
void reply_error(const reply_to *to, uint64_t conn_id, const Llms__Request *req,
                 Llms__ErrorCode code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#endif
