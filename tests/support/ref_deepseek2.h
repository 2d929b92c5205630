/*
 * ref_deepseek2.h — the double-precision reference forward of deepseek2 GGUF models
 * (DeepSeek-V2/V3 and their kin), which ref_forward.c hands deepseek2 files to; the tests
 * use it through ref_forward.h.
 */
#ifndef LLMS_TEST_REF_DEEPSEEK2_H
#define LLMS_TEST_REF_DEEPSEEK2_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/gguf/gguf.h"

typedef struct ref_ds2 ref_ds2;

/* Reads a deepseek2 file's hyper-parameters and weights. NULL on any problem. */
ref_ds2 *ref_ds2_load(const gguf_file *g);
void ref_ds2_free(ref_ds2 *m);
int ref_ds2_n_vocab(const ref_ds2 *m);

/*
 * ref_forward's contract (ref_forward.h): logits (n, n_vocab), hidden (n_layer + 1, n, dim)
 * or NULL, attn (n_layer, n_head, n, n) or NULL; routes (n_layer, n, expert_used_count)
 * or NULL gets each MoE layer's chosen experts in the order of their selection scores
 * (the dense leading layers' entries are -1); kv_f16 rounds the latent and the rotated
 * key, what an absorbed cache holds, to half precision.
 */
void ref_ds2_forward(const ref_ds2 *m, int n, const int32_t *tokens, const int32_t *positions,
                     double *logits, double *hidden, double *attn, int *routes, bool kv_f16);

#endif
