/*
 * chattools.h — conversations with tools (function calling) in the formats of the chat
 * families whose real templates define tool use, written by hand as chat.c writes the
 * others. Each output equals what the model's own Jinja template renders (with Hugging
 * Face's tojson, as transformers and llama.cpp's --jinja apply it):
 *
 *   chatml  Qwen2.5 / Qwen3: a system turn with a "# Tools" section listing the tools in
 *           <tools></tools>; calls as "<tool_call>\n{"name": ..., "arguments": ...}\n
 *           </tool_call>" in the assistant turn; results as "<tool_response>" blocks in
 *           one user turn. With no system message Qwen3's form (no default persona:
 *           chatml serves many models that are not Qwen) — Qwen2.5 would add "You are
 *           Qwen, created by Alibaba Cloud...".
 *   qwen3, qwen3-thinking  the same, with Qwen3's reading of an assistant message's
 *           reasoning and its generation prompt (chat.h): a message before the last query
 *           written without its reasoning, one after it (a call of the current turn) with
 *           its block, its calls right after the block when it has no other text.
 *   hermes  Hermes 2 Pro (Llama-3-8B) / Hermes 3 (Llama-3.1-8B), whose tool_use templates
 *           are one text: a system turn "You are a function calling AI model..." listing
 *           the tools after "<tools> " (each on its own line as the template writes it:
 *           a Python-like signature and "Args:" doc as the description, the parameters
 *           as tojson), then a pydantic FunctionCall schema and the call format; every
 *           message after it as a chatml turn, the system message too; an assistant
 *           message with calls as Qwen's without its text; results as "<tool_response>"
 *           blocks in one "tool" turn, opened only after another message, its
 *           "<|im_end|>" not followed by a line break (as the template writes them).
 *   llama3  Llama 3.1 / 3.2 / 3.3: "Environment: ipython" and the dates in the system
 *           turn, the tools (JSON indented by 4) in the first user turn, a call as the
 *           assistant's whole turn {"name": ..., "parameters": ...} (one per message),
 *           a result as an "ipython" turn holding the result as a JSON string (the
 *           template's tojson of a string).
 *   mistral-v3-tekken  Mistral Nemo (Mistral-Nemo-Instruct-2407): the tools in
 *           "[AVAILABLE_TOOLS][...][/AVAILABLE_TOOLS]" before the last user turn, the
 *           system message at the start of the last turn when the conversation ends with
 *           a user message (dropped otherwise, as the template does); the calls of an
 *           assistant message as one array "[TOOL_CALLS][{"name": ..., "arguments": ...,
 *           "id": ...}, ...]</s>" (its text not written); a result as "[TOOL_RESULTS]
 *           {"content": <the result as it is>, "call_id": ...}[/TOOL_RESULTS]". Ids are 9
 *           letters and digits, as the template demands. Two quirks of the template are
 *           not followed: it writes a call's function object with its keys in the
 *           client's order (here name, then arguments, as mistral-common writes them),
 *           and it compares messages by value to find the last user one (so it would also
 *           put the tools before an earlier user message of the same text).
 *
 *   gpt-oss  chatharmony.h's harmony prompt (date its "Current date", YYYY-MM-DD; the
 *           default reasoning effort), each tool the TypeScript-like type its template
 *           writes.
 *
 * JSON texts (tool definitions, arguments) come written already: JSON is the gateway's
 * (daemon/net/toolcall.c), which writes them as the family's template does (tojson, or
 * mistral's and hermes' own loops over a tool).
 */
#ifndef LLMS_CHATTOOLS_H
#define LLMS_CHATTOOLS_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/tok/chat.h"

/* One call of an assistant message: the function's name, its arguments object as JSON
 * text (one line, ", " and ": " between items, as tojson writes it) and its id (written
 * by mistral only, which wants 9 ASCII letters and digits; NULL for the others). */
struct chat_tool_call {
    const char *name;
    const char *arguments;
    const char *id;
};

/* A message of a conversation with tools: role "system", "user", "assistant" or "tool";
 * an assistant message may hold calls (its content then "" or text said before them); a
 * tool message's content is a call's result, call_id the id of the call it answers
 * (mistral's, as a call's id; NULL for the others). */
struct chat_tool_message {
    const char *role;
    const char *content;
    const struct chat_tool_call *calls;
    int n_calls;
    const char *call_id;
};

/* Whether m's fields are all there: role and content not NULL, calls (each with a name
 * and arguments) only on an assistant message. Which roles a family takes is its own. */
bool chat_tool_message_well_formed(const struct chat_tool_message *m);

/* How a family's replies call tools: each call between open and close, its arguments
 * under args_key; whole: the reply is one call, open being only its first character
 * (llama3's bare {"name": ..., "parameters": ...}), close NULL; array: open is followed
 * by a JSON array of calls, which ends them (mistral's "[TOOL_CALLS][{...}, {...}]"),
 * close NULL. */
struct chat_tool_syntax {
    const char *open, *close, *args_key;
    bool whole, array;
};

/* The family's tool syntax, or NULL when its templates define no tool use. */
const struct chat_tool_syntax *chat_tool_syntax(enum chat_family f);

/* Spaces the family's template indents tool definitions with (0: one line). */
int chat_tools_indent(enum chat_family f);

/*
 * Writes the prompt of msgs[0..n) with the tools' definitions (tools[0..n_tools), each the
 * text of {"type": "function", "function": {...}} as the family's template writes it:
 * tojson, indented as chat_tools_indent asks; mistral's strings unescaped; hermes' the
 * template's own line) like chat_apply_think (snprintf-style, the full length returned;
 * enable_thinking as there). date is llama3's "Today Date"
 * ("26 Jul 2024"). -1 for a family without tool syntax, a NULL field, an unknown role, a
 * call outside an assistant message, and where the template itself refuses: llama3 with
 * more than one call in a message or no user message to hold the tools; mistral with a
 * call or result whose id is not 9 letters and digits, a system message that is not the
 * first, or user and assistant messages that do not alternate from a user one (tool
 * results and assistant messages with calls aside).
 */
int chat_apply_tools(enum chat_family f, const char *const *tools, int n_tools, const char *date,
                     const struct chat_tool_message *msgs, int n, bool add_generation_prompt,
                     bool enable_thinking, char *out, size_t cap);

#endif
