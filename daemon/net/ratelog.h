/*
 * ratelog.h — warnings that an attacker could make the daemon repeat (refused
 * connections, accept() failing for want of descriptors): at most one line per kind
 * every RATELOG_EVERY_MS, with the count of the lines left out, so that a flood costs
 * the journal a line now and then instead of one per event.
 */
#ifndef LLMS_RATELOG_H
#define LLMS_RATELOG_H

#include <stdint.h>

#define RATELOG_EVERY_MS 10000

/* One kind of repeated line; zero-initialised it has logged nothing yet. */
typedef struct ratelog {
    int64_t last_ms;
    unsigned suppressed;
} ratelog;

/* Writes "llmsd: warn: ..." to stderr unless a line of l went out less than
 * RATELOG_EVERY_MS ago, in which case it is only counted. */
void ratelog_warn(ratelog *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
