/*
 * prompt.h — the tokens a new turn adds to a context, and tokenizing into fresh memory.
 *
 * How a chat turn extends a context without recomputing it. The context holds R + G:
 * R, the conversation up to the last assistant opening as the chat template renders
 * it, and G, the text of the tokens generated in the last reply (which may go past the
 * reply the client saw, e.g. when it ended on a stop string such as "<|im_end|>").
 * The new conversation (with the last reply as the client saw it, then the new user
 * message) renders as R + F. When G is a prefix of F, the turn adds F without G:
 * typically the rest of the previous end of turn, the new user message and the new
 * assistant opening. Otherwise, when F holds the reply as the client saw it (after a
 * space the template puts before replies, or G running past a user's stop string), the
 * turn adds what follows the reply in F, less what of it G holds past the reply, so the
 * reply's end of turn is not lost. Otherwise (templates that trim or rewrite earlier
 * messages, raw text in the history) the new user message is rendered alone and
 * appended.
 *
 * gpt-oss's replies are held as the model wrote them, its reasoning's analysis message
 * and its final one; its template takes an earlier reply back as its answer alone,
 * dropping the reasoning. A reply without reasoning continues the rendering as above.
 * One with reasoning is in the context's tokens already (a context only grows): the turn
 * closes G's last message with "<|end|>" and adds what follows the reply in F, so the
 * context differs from the template's rendering of the whole conversation only by that
 * earlier reasoning, where llama.cpp's server would evaluate the rendering again from
 * the reply's start.
 */
#ifndef LLMS_PROMPT_H
#define LLMS_PROMPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/ctx/ctxmgr.h"
#include "engine/tok/chat.h"
#include "engine/err.h"
#include "engine/tok/tokenizer.h"
#include "proto/llms.pb-c.h"

/* Tokenizes len bytes of text into a fresh array (*out, free() it; *n tokens). */
int prompt_tokenize(const tokenizer *tok, const char *text, size_t len, bool add_special,
                    bool parse_special, int32_t **out, int *n, char err[ERR_MAX]);

/* The text a templated (non-raw) Call adds to context c for prompt, as described
 * above; generated is G, the text of the last reply's tokens (NULL for none). Fresh
 * string; NULL + err when the template cannot render it. */
char *prompt_turn_text(enum chat_family family, const ctx_entry *c, const char *generated,
                       const char *prompt, char err[ERR_MAX]);

/*
 * The tokens a Call adds to context c (which holds c->n_tokens tokens) for prompt:
 * raw text as is, otherwise through family's template as described above. The first
 * turn of a context gets the tokenizer's BOS. Fresh array in *out (*n tokens).
 */
int prompt_turn(const tokenizer *tok, enum chat_family family, const ctx_entry *c,
                const char *prompt, bool raw, int32_t **out, int *n, char err[ERR_MAX]);

/* Tokens of a context's start that its sliding window should keep in view: at least
 * at_least, and the system prompt as the template renders it alone (with BOS) when
 * there is one. Only a sizing hint: when the template cannot render a system message
 * alone or memory runs out, at_least. */
int prompt_sink_tokens(const tokenizer *tok, enum chat_family family, const char *system_prompt,
                       int at_least);

/* The prompt text of a stateless Complete: the prompt, or with chat the conversation
 * [system_prompt?, prompt] rendered with the assistant opening (and the template's
 * enable_thinking). Fresh string. */
char *prompt_complete_text(enum chat_family family, const char *prompt, bool chat,
                           const char *system_prompt, bool enable_thinking, char err[ERR_MAX]);

/* The tokens of a Complete's prompt_parts (n of them): each text part tokenized as a
 * Complete's prompt is (special tokens parsed; BOS only when it is the first part), each
 * token part as it is. Fresh array in *out (*n_out tokens). */
int prompt_parts_tokens(const tokenizer *tok, Llms__PromptPart *const *parts, size_t n,
                        int32_t **out, int *n_out, char err[ERR_MAX]);

/* What n prompt_parts weigh: their text bytes and tokens together, the most tokens they
 * can make (a token is at least one byte of text). */
size_t prompt_parts_weight(Llms__PromptPart *const *parts, size_t n);

#endif
