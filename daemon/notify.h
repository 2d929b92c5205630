/*
 * notify.h — telling systemd how llmsd is doing (sd_notify). Every function is a no-op
 * when the daemon does not run under a unit that listens ($NOTIFY_SOCKET unset).
 */
#ifndef LLMS_NOTIFY_H
#define LLMS_NOTIFY_H

#include <stdint.h>

/* READY=1: the model is mapped and the socket listens. */
void notify_ready(void);

/* STATUS=<text>, shown by systemctl status. */
void notify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* RELOADING=1: a reload (SIGHUP) has begun; notify_ready() says it is done. */
void notify_reloading(void);

/* STOPPING=1: shutdown has begun. */
void notify_stopping(void);

/* The interval at which the unit wants WATCHDOG=1, in microseconds, or 0 when it does
 * not ask for one. */
uint64_t notify_watchdog_usec(void);

/* WATCHDOG=1. */
void notify_watchdog(void);

#endif
