/*
 * resp.h — building and packing Response frames, shared by the loop and the worker.
 */
#ifndef LLMS_RESP_H
#define LLMS_RESP_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

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

#endif
