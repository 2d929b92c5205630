/*
 * offload.h — a runner's forwards on a GPU (model_runner_use_gpu), behind
 * model_forward_batch. Internal to engine/model.
 *
 * The host kv_seq stays each context's record: every step's new K/V are copied back into
 * its chunks (written through, one transfer per step), so compression, swapping, the
 * store and restarts work on GPU contexts as on any other. The GPU keeps a copy of the
 * sequences it ran last (device sequences of max_kv entries, as many as fit, the least
 * recently used given up first). Before a step each copy is checked against its host
 * sequence entry by entry (token and position) and brought up to date from the first
 * difference: after a truncation, a reload, or a step that ran on the CPU.
 */
#ifndef LLMS_OFFLOAD_H
#define LLMS_OFFLOAD_H

#include "engine/err.h"
#include "engine/kv/kv.h"
#include "engine/model/model.h"

typedef struct offload offload;

/* The GPU `device` for forwards of m of up to max_batch rows against max_kv entries.
 * NULL + err when the backend refuses (cuda_model_new says why). */
offload *offload_new(const model *m, int device, int max_batch, int max_kv, char err[ERR_MAX]);
void offload_free(offload *o);

/* The device's name. */
const char *offload_device_name(const offload *o);

/* Whether the GPU computes these batches: not when one asks for per-layer hidden states,
 * attention probabilities or another model's rows (the runner's CPU path does those). */
bool offload_takes(const offload *o, int n_seq, const model_batch *batches);

/* model_forward_batch's step on the GPU, for batches it takes, after model_forward_batch
 * has checked them, faulted every chunk in and reserved each sequence's space
 * (n_before[i]: each sequence's length before the step). The outputs and the sequences
 * are as the CPU path leaves them. A single batch longer than max_batch runs in
 * sub-batches. -1 + err (the sequences then have their n_before entries). */
int offload_forward_batch(offload *o, int n_seq, kv_seq *const *seqs,
                          const model_batch *batches, const int *n_before, char err[ERR_MAX]);

#endif
