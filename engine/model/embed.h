/*
 * embed.h — text embeddings from a decoder-only model: the final-norm'd residual stream
 * of the last layer, pooled over the text's tokens and L2-normalised.
 *
 * Pooling EMBED_LAST takes the last token's row, as Qwen3-Embedding does; EMBED_MEAN
 * averages the rows of every token; EMBED_CLS takes the first token's row (on a causal
 * model that is the first token's state alone, as llama.cpp computes it). embed_text adds only the special tokens the GGUF's
 * tokenizer.ggml.add_bos_token / add_eos_token flags ask for (Qwen3-Embedding is
 * trained with <|endoftext|> as the last token: with a GGUF that does not set
 * add_eos_token, tokenize the text, append that id and call embed_tokens). Each text is evaluated from position 0 in a fresh
 * KV sequence, so a text's vector does not depend on what was embedded before it.
 */
#ifndef LLMS_EMBED_H
#define LLMS_EMBED_H

#include <stdint.h>

#include "engine/err.h"
#include "engine/kv/kv.h"
#include "engine/model/model.h"
#include "engine/tok/tokenizer.h"

/* The values of proto Pooling. */
enum embed_pooling { EMBED_LAST = 0, EMBED_MEAN = 1, EMBED_CLS = 2 };

/* The pooling m's file names ({arch}.pooling_type: mean, cls or last): 1 and *out; 0 when
 * it names none (no key); -1 + err when it names one that gives no single vector per
 * text (none: a vector per token; rank: a reranker's scores). */
int embed_pooling_of_model(const model *m, enum embed_pooling *out, char err[ERR_MAX]);

typedef struct embedder embedder;

/* An embedder that evaluates m with runner r (borrowed, used only during embed calls)
 * and takes KV chunks from pool for the duration of each call. NULL + err on failure. */
embedder *embed_new(const model *m, model_runner *r, kv_pool *pool, char err[ERR_MAX]);
void embed_free(embedder *e);

/* Length of the vectors: the model's dim. */
int embed_dim(const embedder *e);

/* Embeds n token ids (1 <= n <= the runner's max_kv) into out (dim), unit length. */
int embed_tokens(embedder *e, const int32_t *tokens, int n, enum embed_pooling pooling,
                 float *out, char err[ERR_MAX]);

/* Tokenizes text with tok (the model's special tokens added as its flags say) and embeds
 * it into out (dim); *n_tokens (may be NULL) gets the token count. Fails when the text
 * has no tokens or more than the runner's max_kv. */
int embed_text(embedder *e, const tokenizer *tok, const char *text, enum embed_pooling pooling,
               float *out, int *n_tokens, char err[ERR_MAX]);

#endif
