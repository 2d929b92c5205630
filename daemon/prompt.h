/*
 * prompt.h — the tokens a new turn adds to a context, and tokenizing into fresh memory.
 *
 * How a chat turn extends a context without recomputing it: the whole conversation
 * (system prompt, earlier turns, the new user message, the assistant opening) is
 * rendered with the model's chat template, and so is the text the context already
 * holds (the rendering up to the previous assistant opening, followed by the exact
 * text of the tokens generated then). When the latter is a prefix of the former, only
 * the remainder is tokenized: typically the previous turn's end-of-turn text, the new
 * user message and the new assistant opening. Templates that rewrite earlier text
 * (trimming, BOS inside the history) break the prefix; then the new user message is
 * rendered alone and appended. A context that holds raw (untemplated) text always
 * takes the second path.
 */
#ifndef LLMS_PROMPT_H
#define LLMS_PROMPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/ctxmgr.h"
#include "engine/chat.h"
#include "engine/err.h"
#include "engine/tokenizer.h"

/* Tokenizes len bytes of text into a fresh array (*out, free() it; *n tokens). */
int prompt_tokenize(const tokenizer *tok, const char *text, size_t len, bool add_special,
                    bool parse_special, int32_t **out, int *n, char err[ERR_MAX]);

/*
 * The tokens a Call adds to context c (which holds c->n_tokens tokens) for prompt:
 * raw text as is, otherwise through family's template as described above. The first
 * turn of a context gets the tokenizer's BOS. Fresh array in *out (*n tokens).
 */
int prompt_turn(const tokenizer *tok, enum chat_family family, const ctx_entry *c,
                const char *prompt, bool raw, int32_t **out, int *n, char err[ERR_MAX]);

/* The prompt text of a stateless Complete: the prompt, or with chat the conversation
 * [system_prompt?, prompt] rendered with the assistant opening. Fresh string. */
char *prompt_complete_text(enum chat_family family, const char *prompt, bool chat,
                           const char *system_prompt, char err[ERR_MAX]);

#endif
