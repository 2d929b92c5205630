/*
 * ref_forward.h — a plain reference forward pass for llama / qwen2 / qwen3 / phi3 / granite
 * / gemma / gemma2 / gemma3 / olmo2 / smollm3 / exaone / exaone4 / stablelm / mistral3 /
 * glm4 / chatglm / command-r / cohere2 GGUF models (and the mixtures of experts: qwen2moe,
 * qwen3moe, llama with experts, olmoe, granitemoe, gpt-oss, deepseek2 (ref_deepseek2.c:
 * DeepSeek-V2/V3's latent attention decompressed)), in double precision from
 * dequantized weights, written independently of engine/model/model.c (all but llama and
 * qwen from Hugging Face's modeling code) so the optimized forward can be checked
 * against it.
 */
#ifndef LLMS_TEST_REF_FORWARD_H
#define LLMS_TEST_REF_FORWARD_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/gguf/gguf.h"

typedef struct ref_model ref_model;

/* Reads hyper-parameters and dequantizes every weight into doubles. NULL on any problem. */
ref_model *ref_model_load(const gguf_file *g);
void ref_model_free(ref_model *m);
int ref_model_n_vocab(const ref_model *m);

/* phi3 with LongRoPE factors: rotates by the long factors (on) or the short ones (off, the
 * default). */
void ref_model_longrope_long(ref_model *m, bool on);

/* Rounds every K and V to half precision before attention, as a KV cache stored in f16
 * does (deepseek2: the latent and the rotated key, what its absorbed cache holds); lets a
 * test separate that rounding from other differences. Off by default. */
void ref_model_round_kv_f16(ref_model *m, bool on);

/* Cohere (command-r, cohere2): the MLP reads the norm of the residual after attention's
 * add (on), as a sequential layer would, rather than the layer input's (off, the model's
 * parallel residual, the default): lets a test show that the parallel residual matters. */
void ref_model_sequential(ref_model *m, bool on);

/* With experts: from the next ref_forward on, the experts each token chose in each layer,
 * in the order of their probabilities (deepseek2: of their selection scores; -1 in its
 * dense leading layers), into routes (n_layer, n, expert_used_count); NULL stops it. */
void ref_model_record_routes(ref_model *m, int *routes);

/*
 * Runs n tokens at the given positions with full causal attention over the list: token
 * i attends to every token j of the list with positions[j] <= positions[i]. logits
 * (n, n_vocab) for every token; hidden (n_layer + 1, n, dim) residual streams or NULL;
 * attn (n_layer, n_head, n, n) attention probabilities or NULL.
 */
void ref_forward(const ref_model *m, int n, const int32_t *tokens, const int32_t *positions,
                 double *logits, double *hidden, double *attn);

#endif
