/*
 * resp.h — transitional (issue 37): the reply names daemon/sched/sched.c calls from
 * before reply_to, mapped onto reply.h until the split of sched.c adopts reply.h
 * (reply_send(&s->to, ...), reply_pack_error). Only sched.c includes it; delete it then.
 */
#ifndef LLMS_RESP_H
#define LLMS_RESP_H

#include "daemon/net/reply.h"

#define resp_error reply_pack_error

#define reply_send(out, max_bytes, conn_id, r, droppable) \
    reply_send(&(reply_to){(out), (max_bytes)}, (conn_id), (r), (droppable))

#endif
