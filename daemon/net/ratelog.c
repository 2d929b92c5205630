/*
 * ratelog.c — rate-limited warnings (ratelog.h).
 */
#include "daemon/net/ratelog.h"

#include <stdarg.h>
#include <stdio.h>

#include "engine/clock.h"

void ratelog_warn(ratelog *l, const char *fmt, ...)
{
    int64_t now = clock_mono_ns() / 1000000;
    if (l->last_ms && now - l->last_ms < RATELOG_EVERY_MS) {
        l->suppressed++;
        return;
    }
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (l->suppressed)
        fprintf(stderr, "llmsd: warn: %s (%u more like it since the last line)\n", line,
                l->suppressed);
    else
        fprintf(stderr, "llmsd: warn: %s\n", line);
    l->last_ms = now;
    l->suppressed = 0;
}
