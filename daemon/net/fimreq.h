/*
 * fimreq.h — a prompt and a suffix as a bare fill-in-the-middle prompt, for the routes
 * that take a suffix beside their prompt (ollama's /api/generate, OpenAI's
 * /v1/completions); llama.cpp's /infill lays out its richer prompt itself (llamacpp.c).
 */
#ifndef LLMS_FIMREQ_H
#define LLMS_FIMREQ_H

#include <stddef.h>

#include "daemon/net/http_internal.h"
#include "proto/llms.pb-c.h"

/*
 * BOS, FIM_PRE prompt FIM_SUF suffix FIM_MID (infill_bare_tokens), laid out with the
 * tokenizer the gateway holds: the default generate model's, so the request must run on
 * that one. Into part (its tokens fresh: free them). 0, or -1 with msg naming 'suffix':
 * another model than the default, or a model without FIM tokens ("does not support
 * insert", as ollama says it).
 */
int fimreq_prompt_part(const hreq *hr, const char *prompt, const char *suffix,
                       Llms__PromptPart *part, char *msg, size_t cap);

#endif
