/*
 * gguf_copy.h — copies of GGUF files with their metadata or tensors changed: a model of
 * the shared test data given a chat template or a reranker prompt it does not have, and
 * the architecture tests' files without a part of theirs, or damaged in one way.
 */
#ifndef LLMS_TEST_GGUF_COPY_H
#define LLMS_TEST_GGUF_COPY_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/err.h"

/* Writes src with key = value to dst. 0, or -1 + err. */
int gguf_copy_with_str(const char *src, const char *dst, const char *key, const char *value,
                       char err[ERR_MAX]);

/* What gguf_copy_edited changes; a zeroed one changes nothing. Tensor names may begin
 * "blk.*." for the tensor of that name in every layer. */
typedef struct gguf_edit {
    const char *rename;      /* the new general.architecture, its {arch}.* number keys
                                renamed with it */
    const char *drop[4];     /* tensors left out (NULL after the last; with fuse_qkv, an
                                attn_qkv too) */
    const char *zero[4];     /* tensors written as zeros, their shapes kept */
    const char *drop_key;    /* a key left out */
    const char *num_key;     /* a key set to num_value: as the file types it (f32 or u32),
                                added as a u32 where the file has none */
    double num_value;
    const char *bools_key;   /* a key set to the array bools[0..n_bools) */
    const bool *bools;
    int n_bools;
    const char *ints_key;    /* a key set to the int32 array ints[0..n_ints) */
    const int32_t *ints;
    int n_ints;
    const char *cut;         /* a 1-D tensor written with its first cut_to elements */
    int64_t cut_to;
    const char *first_row;   /* a 2-D tensor written as its first row alone (1-D) */
    const char *copy_from[2], *copy_to[2]; /* tensors written once more under other names
                                              ("blk.*." pairs: each layer's to its own) */
    bool fuse_qkv;           /* each layer's attn_q, attn_k and attn_v (weights, and biases
                                where all three have them) as one attn_qkv, q's rows first */
} gguf_edit;

/* Writes src changed by e to dst. 0, or -1 + err. */
int gguf_copy_edited(const char *src, const char *dst, const gguf_edit *e, char err[ERR_MAX]);

#endif
