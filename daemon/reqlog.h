/*
 * reqlog.h — llmsd's log on stderr (the journal under systemd): one line per request
 * that used the engine and one per error answered, filtered by the log_level setting.
 *
 *   llmsd: info: request app=1000/default kind=call tokens=42 ms=180.3 outcome=eos
 *   llmsd: info: request app=1000/default kind=call ms=0.1 outcome=NOT_FOUND: no context 'x'
 *   llmsd: error: request app=1000/x kind=embed ms=3.0 outcome=INTERNAL: out of memory
 *
 * Lines are written whole with one call, so the worker and the loop never interleave
 * inside a line.
 */
#ifndef LLMS_REQLOG_H
#define LLMS_REQLOG_H

#include <stdint.h>

#include "proto/llms.pb-c.h"

enum reqlog_level { REQLOG_ERROR = 0, REQLOG_WARN = 1, REQLOG_INFO = 2 };

/* The level names as the log_level setting takes them. */
#define REQLOG_LEVELS "error|warn|info"

/* Sets the level from its name (one of REQLOG_LEVELS; main has checked it). */
void reqlog_set_level(const char *name);

/* Whether lines of level are written. */
int reqlog_enabled(enum reqlog_level level);

/* The request's kind as a short name ("call", "embed", ...). */
const char *reqlog_kind(Llms__Request__BodyCase body);

/* One request's end: app NULL when the writer does not know it, tokens or ms < 0 leave
 * them out; an error code other than OK makes the outcome "CODE: detail", written at
 * error level for INTERNAL and info otherwise. */
void reqlog_request(uint32_t uid, const char *app, Llms__Request__BodyCase body, long tokens,
                    double ms, Llms__ErrorCode code, const char *detail);

#endif
