/*
 * resp.h — the Response packing of reply.h, under the name sched.c still includes.
 */
#ifndef LLMS_RESP_H
#define LLMS_RESP_H

#include "daemon/net/reply.h"

#endif
