/*
 * replyformat.h — whether a GenerationParams' reply format can be enforced.
 *
 * A format and its text go together: FORMAT_JSON_SCHEMA with json_schema, FORMAT_GRAMMAR
 * with grammar, and neither text without its format. Both texts are compiled here once,
 * so that a request, a context's defaults or a graph's node the engine could not run is
 * refused when it arrives, not at each generation.
 */
#ifndef LLMS_REPLYFORMAT_H
#define LLMS_REPLYFORMAT_H

#include "engine/err.h"
#include "proto/llms.pb-c.h"

/* A schema or grammar is compiled by each generation that uses it: bounded, as prompts
 * are. */
#define REPLYFORMAT_TEXT_MAX (64 * 1024)

/* 0 when p's format is one the daemon knows and its schema or grammar compiles (also for
 * p NULL or without a format); -1 and err naming what is wrong otherwise. */
int replyformat_check(const Llms__GenerationParams *p, char err[ERR_MAX]);

#endif
