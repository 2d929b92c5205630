/*
 * bert.h — BERT-family encoders loaded from GGUF with llama.cpp's tensor names, for
 * embeddings and reranking: general.architecture "bert" (bge, all-MiniLM, e5, gte,
 * ms-marco cross-encoders) and "nomic-bert" (nomic-embed-text v1/v1.5).
 *
 * bert is post-norm: x = LN(tok + pos + type embedding); per layer
 * x = LN(x + attn(x)), x = LN(x + down(gelu(up(x)))), LayerNorms and matrices with
 * biases, attention bidirectional within each sequence. A cross-encoder file also has
 * the classification head (cls: dense + tanh over the first ([CLS]) row, cls.output:
 * the scores).
 *
 * nomic-bert is the same post-norm stack with three changes, as llama.cpp runs it: no
 * position table (x = LN(tok + type embedding)); one fused attn_qkv matrix (q, k, v rows
 * in that order; separate attn_q/k/v are taken too) whose q and k are rotated by
 * NeoX-style RoPE (pairs i, i + head_dim/2; base nomic-bert.rope.freq_base); a SwiGLU
 * FFN, down(silu(gate(x)) * up(x)), without biases. The q/k/v and attn_output biases are
 * optional (the nomic-embed files have none); it has no classification head.
 *
 * gemma-embedding (EmbeddingGemma) is a Gemma 3 stack run bidirectionally, with dense
 * layers after pooling; gemma_embed.h says how. bert.c dispatches every call below to it.
 *
 * No KV cache: a text is encoded whole, from position 0. Work is layer by layer over
 * stacked sequences, so a reranker can score candidates after every layer and stop some
 * of them (GRATING's intermediate exits).
 */
#ifndef LLMS_BERT_H
#define LLMS_BERT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"
#include "engine/gguf/gguf.h"

/* bert.pooling_type, with llama.cpp's values. */
enum bert_pooling {
    BERT_POOL_NONE = 0,
    BERT_POOL_MEAN = 1,
    BERT_POOL_CLS = 2,
    BERT_POOL_LAST = 3,
    BERT_POOL_RANK = 4, /* the classification head's scores (a cross-encoder) */
};

enum bert_arch {
    BERT_ARCH_BERT,  /* "bert" */
    BERT_ARCH_NOMIC, /* "nomic-bert" */
    BERT_ARCH_GEMMA_EMBED, /* "gemma-embedding" (gemma_embed.h) */
};

typedef struct bert_hparams {
    enum bert_arch arch;
    int n_vocab;
    int dim;
    int n_layer;
    int n_head;
    int head_dim;  /* gemma-embedding: attention.key_length (n_head * head_dim may differ
                    * from dim) */
    int n_ff;
    int n_pos;     /* the longest sequence accepted: position_embd rows (bert),
                    * nomic-bert.context_length (nomic-bert) */
    int n_types;   /* token_types rows (segment A, B, ...); 1 when a nomic-bert has none */
    float norm_eps;
    float rope_base; /* nomic-bert: RoPE base; gemma-embedding: its global layers'; 0 for
                      * bert */
    enum bert_pooling pooling; /* as the file says; when absent BERT_POOL_CLS
                                * (gemma-embedding: BERT_POOL_NONE, as llama.cpp) */
    int n_cls_out; /* outputs of the classification head; 0 when the file has none (and for
                    * nomic-bert, whose head llama.cpp does not read) */
} bert_hparams;

typedef struct bert_model bert_model;

/* Whether g is an encoder this module loads (general.architecture "bert", "nomic-bert" or
 * "gemma-embedding"). */
bool bert_is_encoder(const gguf_file *g);

/* Validates and takes the model from g (borrowed, must outlive it): hyper-parameters and
 * every tensor's presence, type and shape (errors name the tensor). NULL + err. */
bert_model *bert_from_gguf(const gguf_file *g, char err[ERR_MAX]);

/* Same, mapping the file at path (closed by bert_free). */
bert_model *bert_load(const char *path, char err[ERR_MAX]);

/* NULL is allowed. */
void bert_free(bert_model *m);

const bert_hparams *bert_hparams_of(const bert_model *m);
const gguf_file *bert_gguf(const bert_model *m);

/* A runner owns the thread pool and the scratch for up to max_rows stacked rows, so that
 * the calls below allocate nothing; a sequence is at most min(n_pos, max_rows) rows. One
 * thread at a time. n_threads <= 0: online CPUs; max_rows <= 0: min(n_pos, 512). */
typedef struct bert_runner bert_runner;

bert_runner *bert_runner_new(const bert_model *m, int n_threads, int max_rows, char err[ERR_MAX]);
void bert_runner_free(bert_runner *r);
int bert_runner_max_rows(const bert_runner *r);
/* Bytes of the runner's scratch (the rows' buffers; not its thread pool). */
size_t bert_runner_scratch_bytes(const bert_runner *r);

/*
 * The input rows of n_seq stacked sequences: sequence i has lens[i] tokens (1 ..
 * n_pos), at positions 0 .. lens[i] - 1; tokens and types (NULL: all type 0) hold the
 * rows of all sequences back to back; x (sum lens, dim) receives the normalised
 * embeddings. -1 + err on a bad id, type or length (nothing else is checked here: the
 * row total is the caller's buffer).
 */
int bert_input(const bert_model *m, int n_seq, const int *lens, const int32_t *tokens,
               const int32_t *types, float *x, char err[ERR_MAX]);

/* Layer l over the stacked sequences' rows x (sum lens, dim), in place. The rows must
 * fit the runner's max_rows. -1 + err on bad arguments. gemma-embedding's last layer ends
 * with its output norm. */
int bert_layer(bert_runner *r, int l, int n_seq, const int *lens, float *x, char err[ERR_MAX]);

/* Scores of the classification head for n [CLS] rows (n, dim) (the first row of each
 * sequence) into out (n, n_cls_out); n <= max_rows. -1 + err when the model has no head. */
int bert_head(bert_runner *r, int n, const float *cls_rows, float *out, char err[ERR_MAX]);

/* Pools a sequence's len rows x (len, dim) as `how` says (CLS: row 0, MEAN, LAST) into
 * out (dim), through gemma-embedding's dense layers, and L2-normalises it. -1 + err for
 * another pooling. */
int bert_pool(bert_runner *r, const float *x, int len, enum bert_pooling how, float *out,
              char err[ERR_MAX]);

/*
 * Embeddings of n_seq sequences (bert_input's layout) that fit max_rows together: all
 * layers, then bert_pool into out (n_seq, dim). BERT_POOL_RANK or NONE is refused.
 */
int bert_embed(bert_runner *r, int n_seq, const int *lens, const int32_t *tokens,
               const int32_t *types, enum bert_pooling how, float *out, char err[ERR_MAX]);

#endif
