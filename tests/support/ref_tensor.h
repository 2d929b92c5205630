/*
 * ref_tensor.h — a GGUF tensor as doubles, what the double-precision references
 * (ref_forward.c, ref_bert.c, ref_gemma_embed.c) compute from.
 */
#ifndef LLMS_TEST_REF_TENSOR_H
#define LLMS_TEST_REF_TENSOR_H

#include <stdint.h>

#include "engine/gguf/gguf.h"

/* The tensor called name dequantized to a new array of doubles (row-major, the caller
 * frees it), or NULL when g has no such tensor or (want >= 0) it does not hold want
 * elements. */
double *ref_tensor(const gguf_file *g, const char *name, int64_t want);

#endif
