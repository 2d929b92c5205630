/*
 * chatharmony.h — the prompt of OpenAI's gpt-oss models, in their "harmony" format, as
 * their chat template (openai/gpt-oss-20b's and -120b's chat_template.jinja) writes it:
 *
 *   <|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.
 *   Knowledge cutoff: 2024-06\nCurrent date: DATE\n\nReasoning: EFFORT\n\n# Valid
 *   channels: analysis, commentary, final. Channel must be included for every message.
 *   (with tools: "\nCalls to these tools must go to the commentary channel: 'functions'.")
 *   <|end|>
 *   <|start|>developer<|message|># Instructions\n\nFIRST SYSTEM MESSAGE\n\n# Tools\n\n
 *   ## functions\n\nnamespace functions {\n\nTOOLS} // namespace functions<|end|>
 *   <|start|>user<|message|>...<|end|>
 *   <|start|>assistant<|channel|>final<|message|>...<|end|>
 *   <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>ARGS<|call|>
 *   <|start|>functions.NAME to=assistant<|channel|>commentary<|message|>"RESULT"<|end|>
 *   <|start|>assistant
 *
 * The developer turn is written only when the first message (system or developer) has
 * text or there are tools, each part only when it has something; later system messages
 * are dropped, as the template drops them. An earlier reply's reasoning is dropped, but
 * for a message with calls that no later reply without calls follows (the calls of the
 * turn in progress): its reasoning (or its text, when it has no reasoning) goes before
 * its call as an analysis message. Only a message's first call is written, a result
 * answers the last call written (as JSON text: the template's tojson of a string), and a
 * conversation that ends with a reply, without the generation prompt, ends it with
 * "<|return|>" after its reasoning, as the template writes a training example.
 */
#ifndef LLMS_CHATHARMONY_H
#define LLMS_CHATHARMONY_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/tok/chattools.h"

/* What the template reads besides the messages and the tools. */
struct chat_harmony_opts {
    const char *date;   /* "Current date:", as the template's strftime_now("%Y-%m-%d") */
    const char *effort; /* "Reasoning:": "low", "medium" or "high"; NULL: "medium", the
                           template's default */
    const char *const *reasoning; /* NULL, or per message its reasoning (the template's
                                     "thinking" field; NULL for none) */
};

/* The reasoning efforts the template is trained on, '|'-separated. */
#define CHAT_HARMONY_EFFORTS "low|medium|high"

/* Whether s is one of CHAT_HARMONY_EFFORTS. */
bool chat_harmony_effort_valid(const char *s);

/* The answer of a reply as the model wrote it after the prompt's "<|start|>assistant"
 * ("<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>
 * ANSWER"), as the template takes a reply back: the body of its last final-channel
 * message, up to the "<|end|>", "<|return|>" or "<|call|>" that ends it or the text's end,
 * in *answer (*n bytes, pointing into reply). A reply without "<|message|>" (the model
 * writing plain text) is its own answer; one with messages but no final one (cut while
 * thinking) has an empty answer. */
void chat_harmony_answer(const char *reply, const char **answer, size_t *n);

/*
 * Writes the prompt of msgs[0..n) (roles "system", "developer", "user", "assistant",
 * "tool"; a call's arguments as chattools.h's, tojson's one line) with tools[0..n_tools),
 * each a function as the template's render_tool_namespace writes it ("// description\n
 * type NAME = (_: {\n...}) => any;\n\n", which the gateway writes from the JSON schema),
 * like chat_apply (snprintf-style, the full length returned). -1 for a NULL field, an
 * unknown role or effort, a call outside an assistant message, and where the template
 * raises: a message holding "<|channel|>analysis<|message|>" or
 * "<|channel|>final<|message|>" in its text or reasoning, a message with calls that has
 * both text and reasoning, a result before any call.
 */
int chat_harmony_apply(const struct chat_harmony_opts *o, const char *const *tools, int n_tools,
                       const struct chat_tool_message *msgs, int n, bool add_generation_prompt,
                       char *out, size_t cap);

#endif
