/*
 * gemma_embed.h — EmbeddingGemma (general.architecture "gemma-embedding"), the encoder
 * behind bert.h's third architecture: bert.c loads and runs it through these calls, so
 * that every user of bert.h (embeddings, llms-run --embed) takes it as it takes a bert.
 *
 * A Gemma 3 text stack used bidirectionally, as llama.cpp's LLM_ARCH_GEMMA_EMBEDDING and
 * Hugging Face's Gemma3 with use_bidirectional_attention compute it: token rows times
 * sqrt(dim); per layer an RMSNorm before and after attention and before and after the
 * GeGLU (tanh) feed-forward, the norm weights as the file stores them (the converter's
 * 1 + w already added), per-head RMSNorm of q and k, NeoX RoPE at positions 0 .. n-1 with
 * rope.freq_base on the global layers and rope.freq_base_swa (10000 when absent) on the
 * sliding ones, query scale 1/sqrt(head_dim), grouped KV heads. Every layer sees the whole
 * sequence, but a sliding layer (all but every sliding_window_pattern-th, 6 when absent)
 * only the positions within sliding_window / 2 (integer division) on either side, as
 * llama.cpp's LLAMA_SWA_TYPE_SYMMETRIC masks them. The last layer ends with output_norm
 * (HF's last_hidden_state). The pooled vector then goes through dense_2 and dense_3
 * (sentence-transformers' Dense modules, no bias, identity activation) where the file
 * has them, before bert_pool's L2 normalisation.
 */
#ifndef LLMS_GEMMA_EMBED_H
#define LLMS_GEMMA_EMBED_H

#include <stddef.h>
#include <stdint.h>

#include "engine/encoder/bert.h"
#include "engine/err.h"
#include "engine/gguf/gguf.h"
#include "engine/threadpool.h"

typedef struct gemma_embed gemma_embed;

/* Validates and takes the model from g (borrowed): hyper-parameters, every tensor's
 * presence, type and shape (errors name the key or tensor). Fills hp (n_types 1,
 * rope_base the global layers', n_cls_out 0). NULL + err. */
gemma_embed *gemma_embed_from_gguf(const gguf_file *g, bert_hparams *hp, char err[ERR_MAX]);

/* NULL is allowed. */
void gemma_embed_free(gemma_embed *m);

/* The scratch of up to max_rows stacked rows (at most n_pos in one sequence) on pool
 * (borrowed; its threads run the layers). NULL + err. */
typedef struct gemma_embed_runner gemma_embed_runner;

gemma_embed_runner *gemma_embed_runner_new(const gemma_embed *m, tp_pool *pool, int max_rows,
                                           char err[ERR_MAX]);
void gemma_embed_runner_free(gemma_embed_runner *r);
size_t gemma_embed_runner_scratch_bytes(const gemma_embed_runner *r);

/* (max_rows, dim) rows for bert_embed. */
float *gemma_embed_runner_rows(gemma_embed_runner *r);

/* bert_input's contract: x (sum lens, dim) the scaled token rows. */
int gemma_embed_input(const gemma_embed *m, int n_seq, const int *lens, const int32_t *tokens,
                      float *x, char err[ERR_MAX]);

/* bert_layer's contract; the last layer ends with output_norm. */
int gemma_embed_layer(gemma_embed_runner *r, int l, int n_seq, const int *lens, float *x,
                      char err[ERR_MAX]);

/* A pooled vector (dim) through dense_2 and dense_3, in place (nothing without them). */
void gemma_embed_dense(gemma_embed_runner *r, float *vec);

#endif
