/*
 * model_check.h — a decoder model file's forward pass against the double reference
 * (ref_forward.h), as the model tests run it (test_model.c, test_gemma.c, test_moe.c): on
 * a 260-token vocabulary or larger, tokens (i * 37 + 11) % n_vocab.
 */
#ifndef LLMS_TEST_MODEL_CHECK_H
#define LLMS_TEST_MODEL_CHECK_H

#include "engine/kv/kv.h"
#include "engine/model/model.h"
#include "tests/support/gguf_copy.h"
#include "engine/gguf/modelgen.h"
#include "tests/support/ref_forward.h"

/* What model_check_file runs: a prefill of n_prefill tokens at 0.., single-token decodes
 * up to n_total; then a fresh sequence with gapped and out-of-order batches: 8 tokens at
 * 0..7, the next 8 at gap_b.., then 4 more at gap_c.. (between the two runs, added after
 * them: they see the first run only). */
typedef struct model_check_plan {
    int n_prefill, n_total; /* n_total <= 64, n_prefill >= 20 */
    int gap_b, gap_c;       /* gap_c >= 8, gap_c + 4 <= gap_b */
} model_check_plan;

/* Max |logit diff| of the plan against the reference, on a runner of max_batch rows and
 * n_threads threads (1e9 on an engine error, which is printed). */
double model_check_file(const char *path, int max_batch, int n_threads,
                        const model_check_plan *plan);

/* Prefills 40 tokens (f16 KV), converts every chunk to prec, then runs 4 single-token
 * decodes (attention on decoded blocks) and a 20-token batch (sgemm attention on f32);
 * max |logit diff| against the reference, whose KV is exact (1e9 on an engine error, or
 * when the chunks are not as the forward leaves them: the full ones still prec, the
 * partial one back in f16). */
double model_check_compressed(model *m, const ref_model *rm, enum kv_precision prec);

/* max |a - b| over the largest |a| (at least 1); 1e9 where a difference is NaN. */
double model_check_max_rel(const float *a, const float *b, size_t n);

/* Logits of n tokens (n <= 64) at pos on a fresh sequence of pool, run as one batch, or one
 * token at a time when one_by_one, into out (n, n_vocab); -1 on an engine error, which is
 * printed. */
int model_check_run(model_runner *r, kv_pool *pool, int n_vocab, int n, const int32_t *tok,
                    const int32_t *pos, bool one_by_one, float *out);

/* The partitioned prefill's check: a prompt of MODEL_CHECK_PROMPT tokens after a history
 * of MODEL_CHECK_HIST (its full chunks converted to hist_p) through the runner `part` and
 * through one unpartitioned step of `whole` (runners of m with room for both): the max
 * relative difference (over the largest magnitude, at least 1) of four out rows' logits
 * and last hidden rows; 1e9 on an engine error, which is printed. */
#define MODEL_CHECK_HIST 48
#define MODEL_CHECK_PROMPT 120
double model_check_partitioned(const model *m, model_runner *whole, model_runner *part,
                               enum kv_precision hist_p);

/* The engine's paths against each other, on the model at path (tokens as above): */

/* A prefill of 48 tokens against the same tokens decoded one by one (sgemm attention over
 * f32 K/V against per-row attention over f16 blocks): the max relative logit difference
 * (1e9 on an engine error, which is printed). */
double model_check_prefill_vs_decode(const char *path);

/* Three sequences advanced in one step (two decode rows and a slice of 5: 7 stacked rows)
 * against each advanced alone: 1 when their logits are the same bits, 0 when not, -1 on
 * an engine error (printed); *diff the max relative difference. */
int model_check_batched_vs_alone(const char *path, double *diff);

/* model_check_partitioned over five shapes (score blocks of 4 and 1 row, row slices of
 * 24, 33 and 10 rows, the last two taking the per-row path below 16) after a history of
 * each precision of hist[0..n_hist): the worst difference (1e9 on an engine error). */
double model_check_partitioned_shapes(const char *path, const enum kv_precision *hist,
                                      int n_hist);

/* How much an architecture's part matters: the max |logit difference| of the reference
 * over 40 tokens between the file at path and its copy changed by e (the same weights
 * without the part, written beside it), the copy's reference computed with
 * ref_model_sequential's on when sequential; -1 when a file cannot be written or read
 * (printed). */
double model_check_part_matters(const char *path, const gguf_edit *e, bool sequential);

/* The architecture tests' logits check: p's model written (to dir/NAME-TYPE.gguf) in F32,
 * F16 and Q8_0 and run by model_check_file on the sgemm path (runner of 512 rows, 2
 * threads) and the per-row one (8 rows, 1 thread), each within tol_float (F32, and F16
 * where its products do not round the activations) or tol_quant; the figures printed.
 * The number of files over their tolerance or not written. */
int model_check_types(modelgen_params p, const char *name, const model_check_plan *plan,
                      double tol_float, double tol_quant);

/* One type of model_check_types: p's model written in `type` (to dir/NAME.gguf) against
 * the reference on the sgemm path and the per-row one, each within tol; the figures
 * printed. 0, or 1 when over it or not written. */
int model_check_type(modelgen_params p, uint32_t type, const char *name,
                     const model_check_plan *plan, double tol);

/* A copy of the model at src changed by e (written to dir/NAME-broken.gguf) is refused by
 * model_load with an error holding `named` and `says`; the error printed. 0, or 1 when it
 * loads, says something else or cannot be written. */
int model_check_refused(const char *src, const char *name, const gguf_edit *e, const char *named,
                        const char *says);

/* model_check_compressed of the model at path in f16, int8 and int4 chunks, each within
 * its tolerance (tol[0..3)); the figures printed. The number over or failing. */
int model_check_compressed_file(const char *path, const double tol[3]);

/* The engine's greedy continuation of prompt (n ids) in this process, the model at path
 * loaded as llmsd loads it (its Q8_0 matrices repacked where the CPU has the kernels, so
 * that its products are the daemon's bits): the prompt in one forward, then one token at
 * a time; n_out chosen ids into out, each one's log-probability into lp and the
 * runner-up's id into second. 0, or -1 on an error (printed), n < 1 or
 * n + n_out > MODEL_CHECK_GREEDY_MAX. */
#define MODEL_CHECK_GREEDY_MAX 256
int model_check_greedy(const char *path, const int32_t *prompt, int n, int32_t *out, float *lp,
                       int32_t *second, int n_out);

#endif
