/*
 * lora.h — LoRA adapters in llama.cpp's GGUF format, checked against the base model they
 * adapt, for the forward pass of a model made by model_with_loras (model.h) to apply
 * unmerged: y = W x + s B (A x) for each adapted matrix W.
 *
 * The format is what llama.cpp's convert_lora_to_gguf.py writes and llama_adapter_lora_init
 * reads: general.type "adapter", general.architecture the base's, adapter.type "lora",
 * adapter.lora.alpha (optional), and per adapted matrix W of ne [in, out] the tensors
 * "<W's name>.lora_a" of ne [in, rank] and "<W's name>.lora_b" of ne [rank, out]; the
 * token embedding's pair flipped, as llama.cpp's llm_build_inp_embd reads it: lora_a
 * [rank, n_vocab] (a row per token), lora_b [rank, dim]. A matrix's delta is scaled by
 * s = scale * alpha / rank (scale alone when alpha is 0), rank its lora_b's ne[0], as
 * llama.cpp's get_scale computes it. Any type the engine computes (F32, F16, BF16, Q8_0,
 * ...) may hold a pair.
 *
 * Adaptable matrices: attention q, k, v and output, feed-forward gate, up and down, the
 * output matrix and the token embedding (not when the base ties its output to it: the
 * merged model would change its output too, which llama.cpp does not apply either; so
 * never on Gemma, which always ties it). Any decoder architecture of model.h, Gemma's
 * included (tests/engine/test_lora.c: gemma_adapters).
 * Refused, each with what is wrong: a file that is no adapter, of another architecture,
 * of another adapter type, a tensor that is no .lora_a or .lora_b, a pair missing a half,
 * a matrix the base does not have, a shape that does not fit it, a rank above the
 * matrix's smaller side, a type the engine does not compute, norm weights (which llama.cpp reads past: the model would not be the
 * one trained), a fused matrix (attn_qkv; phi3's ffn_up, gate and up in one), which
 * the forward reads as views of its rows, and a mixture of experts' router, experts or
 * shared expert (the adapter of its attention is applied).
 */
#ifndef LLMS_LORA_H
#define LLMS_LORA_H

#include <stddef.h>

#include "engine/err.h"
#include "engine/model/model.h"
#include "engine/model/ops.h"

/* The matrices of a layer an adapter may adapt, in a slot's order. */
enum lora_kind { LORA_Q, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN, LORA_PER_LAYER };

/* Matrix slots: the token embedding, the output, then each layer's LORA_PER_LAYER. */
#define LORA_SLOT_TOKEN_EMBD 0
#define LORA_SLOT_OUTPUT 1
#define LORA_SLOT(layer, kind) (2 + (layer) * LORA_PER_LAYER + (kind))

/* The largest rank taken (a runner's scratch holds rows of it). */
#define LORA_MAX_RANK 4096
#define LORA_MAX_RANK_TEXT "4096"

/* One adapted matrix: its delta is factor * scale * B (A x). */
typedef struct lora_pair {
    ops_matrix a;  /* (rank, in); the token embedding's (n_vocab, rank): a row per token */
    ops_matrix b;  /* (out, rank) */
    float factor;  /* alpha / rank, or 1 when the file's alpha is 0 or absent */
} lora_pair;

/* Maps the adapter file at path and checks it against base (a model loaded from a file,
 * which must outlive it). NULL + err naming the file and what is wrong. */
lora *lora_load(const model *base, const char *path, char err[ERR_MAX]);

/* NULL is allowed. No model made with it may be in use. */
void lora_free(lora *l);

/* The model it was checked against. */
const model *lora_base(const lora *l);

/* The adapted matrix of a slot, or NULL when the adapter leaves it as it is. */
const lora_pair *lora_pair_at(const lora *l, int slot);

float lora_alpha(const lora *l);     /* adapter.lora.alpha, 0 when absent */
int lora_n_pairs(const lora *l);     /* matrices it adapts */
int lora_max_rank(const lora *l);    /* the largest rank of its pairs */
size_t lora_bytes(const lora *l);    /* bytes of its tensors (what it adds to memory) */

#endif
