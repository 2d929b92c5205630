/*
 * kv_calib.h — calibrating the error model of kv_assign_layer_precisions on a model.
 *
 * The assignment predicts a section's error from its values' spreads, which say how much
 * a code width perturbs them but not how much the model's output follows: on
 * TinyStories-656K an error in layer 0's V moves the next-token distribution 18-34
 * times more per unit of spread than one in layer 1's, and V's block layout costs more
 * than its spread predicts. A calibration measures, on one prefix, the KL divergence of
 * 4-bit codes on each part of each layer alone and divides it by the error the
 * assignment predicts for it: factors that the spreads are then multiplied by.
 */
#ifndef LLMS_KV_CALIB_H
#define LLMS_KV_CALIB_H

#include <stdint.h>

#include "engine/err.h"
#include "engine/kv.h"
#include "engine/model.h"

/* The parts of a layer a factor applies to: K, V per token, V in the block layout. */
enum { KV_CALIB_K, KV_CALIB_V, KV_CALIB_VBLOCK, KV_CALIB_PARTS };

/* KL(softmax(ref) || softmax(got)) of two logit rows of n values, in nats (never below
 * 0): how far a lossy run's next-token distribution is from the exact one's. */
double kv_calib_logits_kl(const float *ref, const float *got, int n);

/*
 * Measures factors (n_layer, KV_CALIB_PARTS) on prefix (resident f16 chunks, full but
 * for the last) followed by the n_forced tokens[i] at positions[i], evaluated as one
 * batch (teacher-forced) on copies of prefix: one with f16 KV (the reference), then one
 * per (layer, part) with that part at 4 bits, that layer's other part at 8 and every
 * other layer f16: 3 n_layer + 1 forwards of n_forced tokens.
 * section_stats (n_chunks, n_layer) are prefix's (kv_chunk_layer_spread, the chunk's
 * density). A factor is the measured mean KL over the predicted error, divided by the
 * mean of all factors; a part whose prediction is zero gets 1. With max_seconds > 0 it
 * gives up after the reference forward when that forward's time times 3 n_layer + 1
 * exceeds max_seconds, and returns 1 (factors unchanged). Allocates its scratch.
 */
int kv_calib_measure(const model *m, model_runner *r, const kv_seq *prefix,
                     const kv_chunk_stats *section_stats, const int32_t *tokens,
                     const int32_t *positions, int n_forced, double max_seconds,
                     float *factors, char err[ERR_MAX]);

/* out[c, l] = in[c, l] with its spreads times layer l's factors, for n_chunks chunks. */
void kv_calib_apply(kv_shape shape, const float *factors, int n_chunks,
                    const kv_chunk_stats *in, kv_chunk_stats *out);

#endif
