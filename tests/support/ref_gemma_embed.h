/*
 * ref_gemma_embed.h — a plain reference of EmbeddingGemma ("gemma-embedding" GGUF files)
 * in double precision from dequantized weights, written from Hugging Face's Gemma3 text
 * model run with use_bidirectional_attention and sentence-transformers' Pooling, Dense
 * and Normalize modules, independently of engine/encoder/gemma_embed.c, so that the
 * encoder can be checked against it. Parts can be left out, so that a test can show that
 * each one changes the result.
 */
#ifndef LLMS_TEST_REF_GEMMA_EMBED_H
#define LLMS_TEST_REF_GEMMA_EMBED_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/gguf/gguf.h"

typedef struct ref_gemma_embed ref_gemma_embed;

/* What the forward leaves out (all false: the model as it is). */
typedef struct ref_gemma_embed_skip {
    bool qk_norm;    /* the per-head q and k norms */
    bool post_norms; /* post_attention_norm and post_ffw_norm */
    bool swa_mask;   /* the sliding layers' window: every layer sees the whole text */
    bool dense;      /* dense_2 and dense_3 */
    bool embd_scale; /* the token rows' sqrt(dim) */
} ref_gemma_embed_skip;

/* Reads hyper-parameters and dequantizes every weight. NULL on any problem. */
ref_gemma_embed *ref_gemma_embed_load(const gguf_file *g);
void ref_gemma_embed_free(ref_gemma_embed *m);

/* The L2-normalised embedding out (dim) of one text of n tokens at positions 0..n-1,
 * pooled as the file's pooling_type says; skip NULL leaves nothing out. */
void ref_gemma_embed_forward(const ref_gemma_embed *m, int n, const int32_t *tokens,
                             const ref_gemma_embed_skip *skip, double *out);

#endif
