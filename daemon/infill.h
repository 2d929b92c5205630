/*
 * infill.h — a fill-in-the-middle prompt (llama.cpp's server's /infill) laid out as
 * llama.cpp's format_infill lays it out, with its default order (prefix, suffix, middle;
 * its --spm-infill order is not taken):
 *
 *   [FIM_REP]myproject\n            repo-level context, with FIM_REP and FIM_SEP
 *   [FIM_SEP]{filename}\n{text}     ... each input_extra chunk
 *   [FIM_SEP]filename\n
 *   [BOS][FIM_PRE]{prefix}{prompt}[FIM_SUF]{suffix}[FIM_MID]
 *
 * Without FIM_SEP each chunk follows the separator "\n\n--- snippet ---\n\n" and no
 * file name; without FIM_REP there is no project line. BOS is there when the tokenizer
 * adds one. The prompt (what of the current line is before the cursor, as editor
 * plugins send it) comes after the prefix, where llama.cpp's code puts it (its README
 * says after FIM_MID). The prefix, suffix, names and chunks are tokenized without
 * special tokens, the prompt with them, as llama.cpp tokenizes them.
 */
#ifndef LLMS_INFILL_H
#define LLMS_INFILL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"
#include "engine/tok/tokenizer.h"

/* A file of the repo-level context (llama.cpp's input_extra). */
typedef struct infill_chunk {
    const char *filename;      /* NULL: llama.cpp's "tmp" */
    const char *text;
} infill_chunk;

typedef struct infill_parts {
    const char *prefix;        /* the code before the hole */
    const char *suffix;        /* the code after it */
    const char *prompt;        /* text after the prefix ("": none) */
    const infill_chunk *extra; /* (n_extra) */
    size_t n_extra;
} infill_parts;

/* Whether tok has the FIM_PRE, FIM_SUF and FIM_MID tokens an infill needs; when not, msg
 * says which it lacks, as llama.cpp's server says it. */
bool infill_supported(const tokenizer *tok, char *msg, size_t cap);

/*
 * The tokens of p's prompt for a window of n_ctx tokens and a reply of n_predict (-1:
 * until the window fills) into a fresh array (*out, free() it; *n tokens). tok must have
 * the tokens infill_supported asks for. What is kept is llama.cpp's budget, its batch
 * size (n_batch: 2048 beside its default window of 4096) taken as half the window: the
 * prefix's last 3 * (n_batch / 4) tokens, the suffix's first n_batch / 4 - 2 - (the
 * prompt's tokens), and the last n_ctx - n_batch - 2 * n_predict tokens of the
 * repo-level context (-1, llama.cpp's default, counting as -1: two tokens more). The
 * prompt is kept whole, so a long one may still pass the window (a Complete refuses such
 * a prompt). 0, or -1 with err (memory, the tokenizer).
 */
int infill_tokens(const tokenizer *tok, const infill_parts *p, int n_ctx, int64_t n_predict,
                  int32_t **out, int *n, char err[ERR_MAX]);

/*
 * The tokens of a fill-in-the-middle prompt as ollama's templates of code models write
 * it (/api/generate's "suffix": qwen2.5-coder's "<|fim_prefix|>{{ .Prompt }}<|fim_suffix|>
 * {{ .Suffix }}<|fim_middle|>"): BOS when the tokenizer adds one, FIM_PRE prefix FIM_SUF
 * suffix FIM_MID, the texts tokenized without special tokens, nothing cut (a prompt past
 * the window is a Complete's to refuse). Into a fresh array (*out, free() it; *n
 * tokens); tok must have the tokens infill_supported asks for. 0, or -1 with err.
 */
int infill_bare_tokens(const tokenizer *tok, const char *prefix, const char *suffix,
                       int32_t **out, int *n, char err[ERR_MAX]);

#endif
