/*
 * gemma_vocab.h — a vocabulary file with Gemma's tokenizer conventions, made from the
 * shared test data's SPM vocabulary (ggml-vocab-llama-spm.gguf): its tokens, scores and
 * types, then Gemma's turn markers "<start_of_turn>" and "<end_of_turn>" as control
 * tokens (llama.cpp's converter makes Gemma's special added tokens control tokens),
 * tokenizer.ggml.add_space_prefix false and add_bos_token true as convert_hf_to_gguf.py
 * writes them for Gemma, and Gemma 2's chat template (google/gemma-2-2b-it). Gemma's own
 * vocabulary (256k tokens, BOS 2, EOS 1, the markers 106 and 107) is not in the test data;
 * what llmsd's tokenizer must do with one is what this file has.
 */
#ifndef LLMS_TEST_GEMMA_VOCAB_H
#define LLMS_TEST_GEMMA_VOCAB_H

#include "engine/err.h"

/* Google's gemma-2-2b-it tokenizer.chat_template. */
extern const char GEMMA_VOCAB_TEMPLATE[];

/* Writes the vocabulary (metadata only) to dst from the SPM vocabulary at src. Token ids:
 * src's, then <start_of_turn> and <end_of_turn>. 0, or -1 + err. */
int gemma_vocab_write(const char *src, const char *dst, char err[ERR_MAX]);

#endif
