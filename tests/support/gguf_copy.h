/*
 * gguf_copy.h — a copy of a GGUF file with one string of metadata set (added or
 * replaced), its tensors unchanged: a model of the shared test data given a chat
 * template or a reranker prompt it does not have.
 */
#ifndef LLMS_TEST_GGUF_COPY_H
#define LLMS_TEST_GGUF_COPY_H

#include "engine/err.h"

/* Writes src with key = value to dst. 0, or -1 + err. */
int gguf_copy_with_str(const char *src, const char *dst, const char *key, const char *value,
                       char err[ERR_MAX]);

#endif
