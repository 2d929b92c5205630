/*
 * ref_bert.h — a plain reference forward for bert and nomic-bert GGUF encoders, in double
 * precision from dequantized weights, written independently of engine/encoder/bert.c so the
 * optimized encoder can be checked against it.
 */
#ifndef LLMS_TEST_REF_BERT_H
#define LLMS_TEST_REF_BERT_H

#include <stdint.h>

#include "engine/gguf/gguf.h"

typedef struct ref_bert ref_bert;

/* Reads hyper-parameters and dequantizes every weight. NULL on any problem. */
ref_bert *ref_bert_load(const gguf_file *g);
void ref_bert_free(ref_bert *m);

/* Encodes one sequence of n tokens (types NULL: all 0) at positions 0..n-1 with
 * bidirectional attention: hidden (n_layer + 1, n, dim) the embedding LayerNorm's rows
 * then every layer's output. nomic-bert: rotary positions, SwiGLU. */
void ref_bert_forward(const ref_bert *m, int n, const int32_t *tokens, const int32_t *types,
                      double *hidden);

/* The classification head on one [CLS] row (dim): dense + tanh when the file has cls,
 * then cls.output. Returns the first output (a reranker's score). */
double ref_bert_head(const ref_bert *m, const double *cls_row);

#endif
