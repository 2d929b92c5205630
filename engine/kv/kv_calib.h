/*
 * kv_calib.h — calibrating the error model of kv_assign_layer_precisions on a model.
 *
 * The assignment predicts a section's error from its values' spreads, which say how much
 * a code width perturbs them but not how much the model's output follows: on
 * TinyStories-656K an error in layer 0's V moves the next-token distribution 18-34
 * times more per unit of spread than one in layer 1's, and V's block layout costs more
 * than its spread predicts. A calibration measures, on one prefix, the KL divergence of
 * 4-bit codes on each part of each layer alone, less that of the layer at 8 bits, and
 * divides it by the error the assignment predicts for it: factors that the spreads are
 * then multiplied by. The 8-bit base matters where the products round activations to 8
 * bits (Q8_0 weights): any change of the KV flips some roundings, which costs about the
 * same whichever part changed (docs-lm-21M-Q8_0: 2.6e-5 to 9.9e-5 nats for one layer
 * at 8 bits, where the F16 file's parts of layers 0-4 cost 1.5e-6 to 3.3e-5 at 4 bits),
 * and without it that common cost made the factors alike.
 */
#ifndef LLMS_KV_CALIB_H
#define LLMS_KV_CALIB_H

#include <stdint.h>

#include "engine/err.h"
#include "engine/kv/kv.h"
#include "engine/model/model.h"

/* The parts of a layer a factor applies to: K, V per token, V in the block layout. */
enum { KV_CALIB_K, KV_CALIB_V, KV_CALIB_VBLOCK, KV_CALIB_PARTS };

/* KL(softmax(ref) || softmax(got)) of two logit rows of n values, in nats (never below
 * 0): how far a lossy run's next-token distribution is from the exact one's. */
double kv_calib_logits_kl(const float *ref, const float *got, int n);

/*
 * A calibration run one forward at a time, so that a caller can spread it over idle
 * periods and give the runner up between (or, with model_runner_set_abort, within)
 * forwards: kv_calib_new copies what it measures on (the prefix's chunks, the forced
 * tokens, the section statistics), so the context it came from may change or go while
 * the calibration waits.
 *
 * prefix: resident f16 chunks, full but for the last, followed by the n_forced
 * tokens[i] at positions[i], evaluated as one batch (teacher-forced) on copies of
 * prefix: one with f16 KV (the reference), then for each layer one with that layer at 8
 * bits (its base) and one per part with that part at 4 bits and the layer's other part
 * at 8, every other layer f16: (KV_CALIB_PARTS + 1) n_layer + 1 forwards of n_forced
 * tokens. section_stats (n_chunks, n_layer) are prefix's (kv_chunk_layer_spread, the
 * chunk's density). A factor is the part's mean KL less its base's, or the standard
 * error of that difference when larger, over the predicted error, divided by the mean
 * of all factors; a part whose prediction is zero gets 1. The copies come from prefix's
 * pool (NULL + err when it refuses them).
 */
typedef struct kv_calib kv_calib;
kv_calib *kv_calib_new(const model *m, const kv_seq *prefix,
                       const kv_chunk_stats *section_stats, const int32_t *tokens,
                       const int32_t *positions, int n_forced, char err[ERR_MAX]);

/* Runs the next forward on r: 0 when more remain, KV_CALIB_DONE when the last one ran
 * (the factors are then kv_calib_factors'), MODEL_ABORTED when r's abort flag stopped it
 * (nothing changed: the same forward runs at the next call), -1 + err. */
#define KV_CALIB_DONE 2
int kv_calib_step(kv_calib *c, model_runner *r, char err[ERR_MAX]);

/* Forwards run so far and in all ((KV_CALIB_PARTS + 1) n_layer + 1). */
int kv_calib_forwards_done(const kv_calib *c);
int kv_calib_forwards_total(const kv_calib *c);

/* Bytes of f16 chunks a forward copies from the calibration's own (to be claimed under a
 * KV budget before kv_calib_step): the prefix and the chunks its tokens append. */
size_t kv_calib_step_bytes(const kv_calib *c);

/* The factors (n_layer, KV_CALIB_PARTS) once kv_calib_step returned KV_CALIB_DONE, else
 * NULL. */
const float *kv_calib_factors(const kv_calib *c);

/* Gives the copies back to their pool. NULL is allowed. */
void kv_calib_free(kv_calib *c);

/*
 * The whole calibration at once (kv_calib_new, then kv_calib_step until done) into
 * factors (n_layer, KV_CALIB_PARTS). With max_seconds > 0 it gives up after the reference
 * forward when that forward's time times the number of forwards exceeds max_seconds,
 * and returns 1 (factors unchanged).
 */
int kv_calib_measure(const model *m, model_runner *r, const kv_seq *prefix,
                     const kv_chunk_stats *section_stats, const int32_t *tokens,
                     const int32_t *positions, int n_forced, double max_seconds,
                     float *factors, char err[ERR_MAX]);

/* out[c, l] = in[c, l] with its spreads times layer l's factors, for n_chunks chunks. */
void kv_calib_apply(kv_shape shape, const float *factors, int n_chunks,
                    const kv_chunk_stats *in, kv_chunk_stats *out);

#endif
