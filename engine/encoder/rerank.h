/*
 * rerank.h — top-K selection of documents for a query with a decoder-only cross-encoder
 * (the GRATING design): every candidate is scored by the probability of "yes" against
 * "no" after the model's reranker prompt, all candidates advance together layer by
 * layer, and once their provisional scores disperse enough, clusters of clear winners
 * and clear losers stop computing.
 *
 * Scoring: each (query, document) pair is rendered with the reranker prompt (the
 * model's own from the GGUF metadata key "tokenizer.chat_template.rerank" when present,
 * with the placeholders {query}, {document} (once) and optionally {instruction}; else the
 * Qwen3-Reranker format documented in rerank.c), tokenized (special tokens are
 * recognised in the template, never in the query or document text), and run through
 * the layers; a pair holds at most the model's trained context ({arch}.context_length:
 * scores at positions past it are noise), so the document's tokens are cut to fit, and
 * the prompt's text after {document} (the question the answer token answers) stays
 * whole. The score at layer l is
 * sigmoid(logit_yes - logit_no) of the final-norm'd hidden state of the last token at
 * that layer against the output rows of the "yes" and "no" tokens (for models without
 * such tokens, e.g. stories260K, options.yes_token/no_token give the rows to use).
 *
 * Memory: the weights may be read layer by layer from the file into two buffers by an
 * I/O thread (dual-layer sliding window) instead of mapped whole; candidates run in
 * chunks sized from memory_limit; hidden states of finished chunks can be offloaded to
 * a temporary file; embedding rows come from an LRU cache.
 *
 * A reranker is used by one thread at a time.
 */
#ifndef LLMS_RERANK_H
#define LLMS_RERANK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"

enum rerank_mode {
    RERANK_SET,     /* only membership of the top-K matters: prune winners and losers */
    RERANK_ORDERED, /* exact order and scores of the winners: prune only hopeless ones */
};

typedef struct rerank_options {
    int top_k;               /* >= 1; more than the candidates: all of them */
    enum rerank_mode mode;
    /* Coefficient of variation of the active candidates' provisional scores above which
     * a layer's scores are clustered and pruned; <= 0 disables pruning (full forward). */
    float cv_threshold;
    /* Bytes for the activations of one chunk of candidates (0: 64 MiB). A chunk holds at
     * least one candidate whatever the limit. When the hidden states of all candidates
     * exceed it and there are more than three chunks, they are offloaded to an unlinked
     * temporary file in scratch_dir (three chunks' worth in memory). */
    size_t memory_limit;
    /* The directory of that temporary file, taken at rerank_open only (copied). NULL or
     * "": none, and the hidden states stay in memory whatever memory_limit says. The
     * caller chooses it: the engine opens no file but its model (the daemon passes
     * $TMPDIR, else /tmp). */
    const char *scratch_dir;
    /* Most rows in one chunk (0: memory_limit alone decides); a chunk still holds at
     * least one candidate. rerank_step computes whole chunks, so this bounds its work. */
    long max_chunk_tokens;
    bool stream_weights;     /* dual-layer sliding window instead of the whole mapping */
    int32_t yes_token, no_token; /* -1: find "yes" / "no" in the vocabulary */
    int n_threads;           /* <= 0: online CPUs; taken at rerank_open only */
} rerank_options;

/* Defaults: top_k 5, RERANK_SET, cv_threshold 0.2 (see rerank.c), memory_limit 0,
 * scratch_dir NULL, max_chunk_tokens 0, stream_weights true, yes/no -1, n_threads 0. */
rerank_options rerank_default_options(void);

typedef struct rerank_result {
    int n;                   /* entries of index/score: min(top_k, n_docs) */
    /* (n) document indices, best first by score (ties: lower index first). In
     * RERANK_SET with pruning the scores of early-selected documents come from the layer
     * they stopped at, so only membership is meaningful. */
    int *index;
    float *score;            /* (n) their scores in [0, 1] at the layer they stopped */
    /* statistics */
    int n_layer;
    int *layers_computed;    /* (n_docs) layers each candidate went through */
    /* (n_layer) candidates that stopped after each layer (selected or dropped; those
     * still running at the last layer count there, so the entries sum to n_docs) */
    int *pruned_at_layer;
    size_t peak_bytes;       /* largest memory the call held: weights buffers, activations,
                                caches (not the file mapping when stream_weights is off) */
    double ms;               /* wall time of the call */
} rerank_result;

void rerank_result_free(rerank_result *r);

typedef struct reranker reranker;

/* Opens a llama / qwen2 / qwen3 GGUF as a reranker (other decoders are refused). With options->stream_weights the
 * weight matrices are not mapped: only metadata, the tokenizer and small tensors are
 * kept, and layers are read on demand. A bert cross-encoder (a classification head,
 * engine/encoder/bert.h) is opened too: it scores sigmoid(head) of the [CLS] row after each
 * layer, pairs are [CLS] query [SEP] document [SEP] (documents cut to 512 tokens), and
 * its weights stay mapped. NULL + err on failure (a bert without a head among them). */
reranker *rerank_open(const char *model_path, const rerank_options *options,
                      char err[ERR_MAX]);
void rerank_close(reranker *rr);

/* The ids of the "yes" and "no" answer tokens: the options' yes_token / no_token, or
 * those words found in the vocabulary (a bert cross-encoder has none: -1 and -1). -1 + err naming the one given out of range or
 * missing from the vocabulary (then yes_token / no_token must be set). */
int rerank_answer_tokens(const reranker *rr, const rerank_options *o, int32_t *yes,
                         int32_t *no, char err[ERR_MAX]);

/* Whether query leaves room for a document: a pair holds at most the model's trained
 * context (a decoder: the rendered prompt; a bert cross-encoder: min(positions, 512)
 * tokens) and documents are cut to fit, so a query whose prompt leaves no room for one
 * document token is refused (-1 + err naming its tokens; rerank_run and rerank_begin
 * fail on it too). 0 when it fits. */
int rerank_query_fits(const reranker *rr, const char *query, char err[ERR_MAX]);

/* Scores n_docs documents against query and returns the top-K in *out (freed with
 * rerank_result_free). options NULL: those given to rerank_open; any options may differ
 * from those of rerank_open (stream_weights too) except n_threads. Documents too long
 * for a pair are cut (see above). An empty query or document, a query that leaves no
 * room for a document (rerank_query_fits), n_docs < 1 or top_k < 1 give -1 + err. */
int rerank_run(reranker *rr, const char *query, const char *const *docs, int n_docs,
               const rerank_options *options, rerank_result *out, char err[ERR_MAX]);

/* Same on token ids already rendered with the reranker prompt (benchmarks and tests
 * that score fixed token sequences): pairs[i] has lens[i] tokens, at most what a pair
 * holds (see rerank_query_fits); a longer one is -1 + err, not cut. */
int rerank_run_tokens(reranker *rr, const int32_t *const *pairs, const int *lens, int n_docs,
                      const rerank_options *options, rerank_result *out, char err[ERR_MAX]);

/*
 * The same work in steps, for a scheduler that interleaves it with other work: begin
 * validates, renders and allocates; each rerank_step computes whole chunks of one layer
 * at a time until it has computed max_rows rows (at least one chunk) or the run ends.
 * Only one task of a reranker may exist at a time (they share its I/O queue and caches);
 * rerank_run and rerank_run_tokens are a task run in one step.
 */
typedef struct rerank_task rerank_task;

/* As rerank_run / rerank_run_tokens up to the first layer. The token variant borrows
 * pairs until rerank_task_free; lens and options are copied. NULL + err on failure. */
rerank_task *rerank_begin(reranker *rr, const char *query, const char *const *docs, int n_docs,
                          const rerank_options *options, char err[ERR_MAX]);
rerank_task *rerank_begin_tokens(reranker *rr, const int32_t *const *pairs, const int *lens,
                                 int n_docs, const rerank_options *options, char err[ERR_MAX]);

/* 1 when the run has ended, 0 when there is more to do, -1 + err on failure (the task
 * then only answers -1 and can be freed). */
int rerank_step(rerank_task *t, long max_rows, char err[ERR_MAX]);

/* Rows the rest of the run computes at most (token rows times the layers left of the
 * candidates still active); at least 1 until the run has ended, then 0. */
long rerank_task_rows_left(const rerank_task *t);

/* The top-K of an ended run into *out (freed with rerank_result_free); once per task.
 * ms counts from rerank_begin, the time between steps included. -1 + err on failure. */
int rerank_task_result(rerank_task *t, rerank_result *out, char err[ERR_MAX]);

void rerank_task_free(rerank_task *t);

#endif
