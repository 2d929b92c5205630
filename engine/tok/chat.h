/*
 * chat.h — turning a conversation into a prompt with a model's chat template.
 *
 * There is no Jinja interpreter: as in llama.cpp, a model's tokenizer.chat_template is
 * recognised by distinctive markers and mapped to a known family, whose format is
 * written by hand. The output for every family equals llama.cpp's
 * llm_chat_apply_template() for the family of the same name and the same messages, but
 * for zephyr (see below). No family writes the BOS text that starts the prompt ("<s>",
 * "<|begin_of_text|>"): the tokenizer adds BOS.
 */
#ifndef LLMS_CHAT_H
#define LLMS_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/gguf/gguf.h"

enum chat_family {
    /* Not a model's format: "System: ...\nUser: ...\nAssistant: ...\n" lines, and
     * "Assistant:" as the generation prompt; for models without a known template. */
    CHAT_PLAIN,
    /* "<|im_start|>role\ncontent<|im_end|>\n" (Qwen, SmolLM, OpenHermes...) */
    CHAT_CHATML,
    /* chatml, from NousResearch's Hermes 2 Pro and Hermes 3, whose tool_use template
     * writes tools and calls its own way (chattools.h); chats without tools are chatml,
     * their default template */
    CHAT_HERMES,
    /* "<|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>", content trimmed */
    CHAT_LLAMA3,
    /* "[INST] user [/INST]assistant</s>"; a system message is put first in the turn */
    CHAT_LLAMA2,
    /* the same with the system message in a "<<SYS>>\n...\n<</SYS>>\n\n" block */
    CHAT_LLAMA2_SYS,
    /* LLAMA2_SYS with "<s>" before each later "[INST]" (template writes bos_token
     * inside the history) */
    CHAT_LLAMA2_SYS_BOS,
    /* LLAMA2_SYS with every message trimmed (template uses content.strip()) */
    CHAT_LLAMA2_SYS_STRIP,
    /* Mistral's official templates: " [INST] user [/INST] assistant</s>" (v1),
     * "[INST] user[/INST] assistant</s>" (v3, assistant trimmed),
     * "[INST]user[/INST]assistant</s>" (v3-tekken),
     * "[SYSTEM_PROMPT] sys[/SYSTEM_PROMPT][INST] user[/INST] assistant</s>" (v7) */
    CHAT_MISTRAL_V1,
    CHAT_MISTRAL_V3,
    CHAT_MISTRAL_V3_TEKKEN,
    CHAT_MISTRAL_V7,
    /* "<|role|>\ncontent</s>\n" (TinyLlama-Chat, zephyr-7b-beta). llama.cpp's "zephyr"
     * ends a message with "<|endoftext|>", the EOS of StableLM's zephyr, which llmsd does
     * not run; these templates write eos_token, "</s>" in the llama vocabulary. */
    CHAT_ZEPHYR,
    /* "<|role|>\ncontent\n" (Falcon3). Falcon3's template also writes eos_token after an
     * assistant message; llama.cpp's format, kept here, leaves it out */
    CHAT_FALCON3,
    /* "sys\n\n<｜User｜>user<｜Assistant｜>assistant<｜end▁of▁sentence｜>"
     * (DeepSeek-R1-Distill-Llama/Qwen). Their template writes the system message without
     * "\n\n" and opens the reply with "<think>\n"; llama.cpp's format, kept here, does
     * neither, and the model writes "<think>" itself. As their template, and unlike
     * llama.cpp's format, an earlier reply is written without its reasoning (what follows
     * its last "</think>") */
    CHAT_DEEPSEEK3,
    /* "GPT4 Correct User: user<|end_of_turn|>GPT4 Correct Assistant: ..." (OpenChat 3.5,
     * Starling) */
    CHAT_OPENCHAT,
    /* "sys\n\nUSER: user\nASSISTANT: assistant</s>\n" (Vicuna 1.1); the Orca variant
     * writes the system message as "SYSTEM: sys\n" */
    CHAT_VICUNA,
    CHAT_VICUNA_ORCA,
    /* "sys### Instruction:\nuser\n### Response:\nassistant\n<|EOT|>\n" (DeepSeek Coder
     * instruct) */
    CHAT_DEEPSEEK,
    /* "role\ncontent</s>\n" with "<s>" before each later message (AlphaMonarch) */
    CHAT_MONARCH,
    /* "<|role_start|>role<|role_end|>content<|turn_end|>" (Megrez-3B-Instruct) */
    CHAT_MEGREZ,
    /* chatml as Qwen3's template writes it (the hybrid thinking models): an earlier
     * reply's reasoning ("<think>...</think>" before its answer) dropped from the history,
     * an assistant message after the last user query written with its block
     * ('<think>\n' + reasoning + '\n</think>\n\n' + answer); with enable_thinking false
     * the generation prompt closes an empty block ("<think>\n\n</think>\n\n") */
    CHAT_QWEN3,
    /* qwen3 whose generation prompt opens the block, "<|im_start|>assistant\n<think>\n",
     * whatever enable_thinking says (Qwen3's Thinking-2507 models, QwQ-32B, whose own
     * template differs only in dropping every earlier reply's reasoning and in writing its
     * tools' system turn with two more line breaks when there is no system message) */
    CHAT_QWEN3_THINKING,
    /* "<|role|>\ncontent<|end|>\n" (Phi-3, Phi-3.5, and Phi-4-mini, whose own template
     * writes no line breaks; llama.cpp's phi3 format, kept here, does) */
    CHAT_PHI3,
    /* "<|im_start|>role<|im_sep|>content<|im_end|>" (Phi-4) */
    CHAT_PHI4,
    /* "<|start_of_role|>role<|end_of_role|>content<|end_of_text|>\n" (Granite 3); the
     * generation prompt is "<|start_of_role|>assistant<|end_of_role|>" as Granite's
     * template writes it, where llama.cpp's format adds a line break */
    CHAT_GRANITE,
    /* "<start_of_turn>user\ncontent<end_of_turn>\n<start_of_turn>model\n..." (Gemma,
     * CodeGemma, Gemma 2, Gemma 3): the assistant's role is "model", every content
     * trimmed; Gemma has no system turn, so a system message's content (trimmed) and
     * "\n\n" open the next user turn, as Gemma 3's template and llama.cpp's format do
     * (Gemma 2's template refuses one) */
    CHAT_GEMMA,
    /* "[|system|]content[|endofturn|]\n[|user|]content\n[|assistant|]content[|endofturn|]\n"
     * (EXAONE 3.0, 3.5), every content trimmed, as llama.cpp's exaone3 format (EXAONE
     * 3.5's own template writes an empty system turn before a first message of another
     * role, and trims nothing) */
    CHAT_EXAONE3,
    /* SmolLM3's template (chatml turns): a system block of metadata (the knowledge cutoff,
     * today's date, "Reasoning Mode: /think" or "/no_think") and the custom instructions,
     * the system message's or the template's default for the mode, never closed by
     * "<|im_end|>" (as the template writes it without tools); "/think" or "/no_think" in
     * the system message sets the mode, enable_thinking otherwise; "/system_override"
     * makes the system message the whole block. In "/no_think" mode every assistant turn
     * and the generation prompt start with an empty block "<think>\n\n</think>\n".
     * llama.cpp has no such format: its chatml would drop the mode and the date */
    CHAT_SMOLLM3,
    /* OpenAI's harmony format (gpt-oss): "<|start|>role<|message|>content<|end|>", a
     * system turn of the model's identity, dates and reasoning effort, the system message
     * as a developer turn's instructions, replies in channels (analysis: the reasoning;
     * final: the answer; commentary: tool calls), written as chatharmony.h says; the
     * generation prompt is "<|start|>assistant", the model writing the channel itself */
    CHAT_GPT_OSS,
    /* "[gMASK]<sop><|role|>\ncontent" (GLM-4-9B-chat, GLM-4-0414), the generation prompt
     * "<|assistant|>\n", as llama.cpp's chatglm4 format; a reply ends at the next turn's
     * "<|user|>" (the file's end-of-turn token) or at "<|endoftext|>" (its EOS) */
    CHAT_CHATGLM4,
    /* GLM-Z1's template (the GLM-4-0414 reasoning models): chatglm4's turns, every system
     * message first, every other message's text after its last "</think>", stripped; the
     * generation prompt opens the block, "<|assistant|>\n<think>" */
    CHAT_GLM_Z1,
    /* "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>content<|END_OF_TURN_TOKEN|>" (Command-R,
     * Command-R+, Aya 23, Aya Expanse; SYSTEM_TOKEN and CHATBOT_TOKEN for the other roles),
     * every content trimmed; the generation prompt opens a CHATBOT_TOKEN turn. Their
     * templates write a default preamble when there is no system message; llama.cpp's
     * command-r format, kept here, does not */
    CHAT_COMMAND_R,
    /* "<seed:bos>role\ncontent<seed:eos>" (Seed-OSS), the assistant's content trimmed, the
     * generation prompt "<seed:bos>assistant\n", as llama.cpp's seed_oss format. The
     * template's default system message of the thinking budget is not written, nor is
     * the reply's "<seed:think>" block told from its answer */
    CHAT_SEED_OSS,
    /* Hunyuan's dense models, as llama.cpp's hunyuan-dense format writes them: a first
     * system message followed by "<｜hy_place▁holder▁no▁3｜>" (a later one dropped), a user
     * turn "<｜hy_User｜>content<｜hy_Assistant｜>" (the generation prompt whatever the
     * flag), an assistant turn "<｜hy_Assistant｜>content<｜hy_place▁holder▁no▁2｜>" (its
     * marker written twice after a user turn, as llama.cpp writes it; Hunyuan's own
     * template is not in the test data to compare) */
    CHAT_HUNYUAN_DENSE,
    /* "[gMASK]sop<|role|>\n content" (ChatGLM3-6B: a space after each line break), the
     * generation prompt "<|assistant|>", as llama.cpp's chatglm3 format; a reply ends at
     * the next turn's "<|user|>" */
    CHAT_CHATGLM3,
    /* "[SYSTEM_PROMPT]sys[/SYSTEM_PROMPT][INST]user[/INST]assistant</s>" (Mistral Small 3.1
     * and later, Magistral, Devstral: v7 without the spaces), as llama.cpp's
     * mistral-v7-tekken; chosen by name only, as llama.cpp detects mistral-v7 for every
     * [SYSTEM_PROMPT] template */
    CHAT_MISTRAL_V7_TEKKEN,
    /* "sys\n\nUser: user\n\nAssistant: assistant<｜end▁of▁sentence｜>" (DeepSeek-V2-Chat,
     * V2-Lite-Chat), the generation prompt "Assistant:", as llama.cpp's deepseek2 format
     * and their template, which writes eos_token, this text, after a reply */
    CHAT_DEEPSEEK2,
    /* GLM-4.7's template (GLM-4.7, GLM-4.7-Flash) without tools: "[gMASK]<sop>", then
     * "<|role|>content" with no line break after the role; an assistant message is
     * "<|assistant|>", its block "<think>" + reasoning (stripped) + "</think>" when it
     * follows the last user message and has reasoning, "</think>" alone otherwise, and its
     * answer (the text after its last "</think>") stripped; the generation prompt
     * "<|assistant|><think>" opens the block, "<|assistant|></think>" with enable_thinking
     * false. A reply ends at "<|user|>" or "<|observation|>" (the file's end-of-turn
     * tokens). GLM-4.5's and 4.6's templates write a line break after each role and
     * "/nothink" for the switch: not this family */
    CHAT_GLM_4_7,
    /* ERNIE 4.5's template (ERNIE-4.5-0.3B, 21B-A3B, 300B-A47B): "<|begin_of_sentence|>"
     * (its cls_token, written by the template: BOS is "<s>"), then "sys\n",
     * "User: user\n", "Assistant: assistant<|end_of_sentence|>", the generation prompt
     * "Assistant: "; a reply ends at "<|end_of_sentence|>" (its sep_token, which the
     * file does not mark end-of-generation). llama.cpp has no such format */
    CHAT_ERNIE4_5,
    /* GLM-4.5's and GLM-4.6's template (GLM-4.5, GLM-4.5-Air, GLM-4.6) without tools:
     * "[gMASK]<sop>", then "<|role|>\ncontent"; an assistant message is "<|assistant|>\n"
     * and its block, "<think>" + reasoning (stripped) + "</think>" when it follows the last
     * user message, "<think></think>" otherwise, then its answer (the text after its last
     * "</think>", stripped) after a line break where it is not empty; the generation
     * prompt is "<|assistant|>", the model opening its block itself after a line break.
     * With enable_thinking false each user message ends with "/nothink" (unless it does
     * already) and the generation prompt closes an empty block:
     * "<|assistant|>\n<think></think>". A reply ends at "<|user|>" or "<|observation|>"
     * (the file's end-of-turn tokens) */
    CHAT_GLM_4_5,
};

/* The number of families: they are 0 .. CHAT_N_FAMILIES - 1. */
#define CHAT_N_FAMILIES ((int)CHAT_GLM_4_5 + 1)

/*
 * The family of a template: either one of the names chat_family_name() gives, or the
 * text of tokenizer.chat_template, recognised like llama.cpp does ("<|im_start|>" ->
 * chatml, "[INST]" -> the llama2/mistral variants, "<|start_header_id|>" with
 * "<|end_header_id|>" -> llama3, "<｜User｜>" -> deepseek3, "<|im_start|>" with
 * "<|im_sep|>" -> phi4, "<|assistant|>" with "<|end|>" -> phi3, "<|start_of_role|>" ->
 * granite...), but for "<|user|>"
 * templates: one that ends a user message with eos_token or "</s>" is zephyr, another
 * with "<|assistant|>" falcon3 (llama.cpp takes TinyLlama's and Falcon3's templates for
 * GLM-Edge's), and for Hermes' tool_use template: "<|im_start|>" with its system prompt's
 * "You are a function calling AI model." is hermes, and "<|im_start|>" with the think
 * markers ("</think>", which Qwen3's and QwQ's templates split earlier replies at) is
 * qwen3, or qwen3-thinking where the generation prompt opens the block
 * ('<|im_start|>assistant\n<think>'), but SmolLM3's ("<|im_start|>" with its "Reasoning
 * Mode" line) smollm3; "<start_of_turn>" is gemma; "[|system|]", "[|assistant|]" and
 * "[|endofturn|]" exaone3; "<|start|>" with "<|channel|>" and "<|message|>" is gpt-oss;
 * "[gMASK]<sop>" is chatglm4, or glm-z1 where the generation prompt opens a think block
 * ("<|assistant|>\n<think>"), or glm-4.7 where the template writes GLM-4.5's tool calls
 * ("<arg_key>") and not GLM-4.5's and 4.6's "/nothink", or glm-4.5 where it writes
 * "/nothink"; "<|START_OF_TURN_TOKEN|>" with "<|USER_TOKEN|>" command-r;
 * "'Assistant: ' + message['content'] + eos_token" deepseek2; "<|begin_of_sentence|>" with
 * "<|end_of_sentence|>" and "User: " ernie4_5.
 * NULL or anything else gives CHAT_PLAIN.
 */
enum chat_family chat_detect(const char *template_text);

/* chat_detect of a model file's tokenizer.chat_template (CHAT_PLAIN without one); hermes
 * too where that is chatml or absent and tokenizer.chat_template.tool_use is Hermes' (how
 * llama.cpp's converter stores a model's named templates: Hermes' files hold their chatml
 * "default" one as the template and "tool_use" beside it); gpt-oss where there is no
 * known template and the vocabulary holds harmony's control tokens ("<|start|>",
 * "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>"). */
enum chat_family chat_detect_file(const gguf_file *g);

/* Short name of a family ("chatml", "llama3", "llama2-sys", "mistral-v7", "plain"...). */
const char *chat_family_name(enum chat_family f);

/* Every family's chat_family_name, in enum order, '|'-separated: the choices of a
 * setting that names one (test_chat holds the two to each other). */
#define CHAT_FAMILY_NAMES                                                                    \
    "plain|chatml|hermes|llama3|llama2|llama2-sys|llama2-sys-bos|llama2-sys-strip|"         \
    "mistral-v1|mistral-v3|mistral-v3-tekken|mistral-v7|zephyr|falcon3|deepseek3|openchat|" \
    "vicuna|vicuna-orca|deepseek|monarch|megrez|qwen3|qwen3-thinking|phi3|phi4|granite|gemma|" \
    "exaone3|smollm3|gpt-oss|chatglm4|glm-z1|command-r|seed_oss|hunyuan-dense|chatglm3|"    \
    "mistral-v7-tekken|deepseek2|glm-4.7|ernie4_5|glm-4.5"

struct chat_message {
    const char *role; /* "system", "user" or "assistant" */
    const char *content;
};

/*
 * Writes the prompt for msgs[0..n) to out, like snprintf: at most cap bytes including a
 * terminating NUL (out may be NULL when cap is 0), and returns the full length without
 * the NUL, so the output was complete when the result is < cap. add_generation_prompt
 * appends the opening of an assistant turn where the family has one (the llama2 and
 * mistral families end a user turn with it already and ignore it, as llama.cpp does).
 * Returns -1 for an unknown family, a NULL message field, a role other than the three
 * above, n < 0, a result longer than INT_MAX, or no memory for smollm3's system text.
 */
int chat_apply(enum chat_family f, const struct chat_message *msgs, int n,
               bool add_generation_prompt, char *out, size_t cap);

/* chat_apply with the templates' enable_thinking (chat_apply's is true, their default):
 * false makes qwen3's generation prompt close an empty block and glm-4.7's close the
 * block it opens otherwise, so that the model answers without thinking, glm-4.5's close an
 * empty block and its user messages end with "/nothink", and smollm3's
 * mode "/no_think" (unless its system message says
 * "/think"); the other families' templates have no such switch and ignore it. gpt-oss is
 * written with today's date (local time, as the template's strftime_now) and the default
 * reasoning effort (chatharmony.h writes it with others). */
int chat_apply_think(enum chat_family f, const struct chat_message *msgs, int n,
                     bool add_generation_prompt, bool enable_thinking, char *out, size_t cap);

/* How a family's replies carry reasoning: "<think>...</think>" before the answer, which
 * the gateway tells apart from it (daemon/net/reasoning.h). */
enum chat_think {
    CHAT_THINK_NONE,   /* its templates have no think markers: a reply is all answer */
    CHAT_THINK_REPLY,  /* a reply opens its block itself (qwen3, deepseek3, smollm3) */
    CHAT_THINK_OPENED, /* the generation prompt opened it: a reply begins inside it
                          (qwen3-thinking, glm-z1, glm-4.7) */
    CHAT_THINK_HARMONY, /* no think markers: a reply's analysis channel is its reasoning,
                           its final channel the answer (gpt-oss) */
    CHAT_THINK_REPLY_SPACED, /* a reply opens its block itself after white space, which is
                                dropped, as is white space before an answer without a
                                block (glm-4.5: "\n<think>...</think>\nanswer") */
};

/* The families whose templates have the think markers, as chat_detect found them in the
 * template's text, and gpt-oss; CHAT_THINK_NONE for the others and for an unknown
 * family. */
enum chat_think chat_thinking(enum chat_family f);

/* chat_thinking of a reply to a prompt written with chat_apply_think's enable_thinking:
 * CHAT_THINK_REPLY where false makes the generation prompt close the block the family's
 * opens otherwise (glm-4.7's "<|assistant|></think>": the reply is the answer, unless it
 * opens a block itself), chat_thinking(f) for the rest. */
enum chat_think chat_thinking_for(enum chat_family f, bool enable_thinking);

/*
 * An assistant message's text as the thinking templates read it back (Qwen3's and the R1
 * distills'): when it holds "</think>", *answer is what follows its last one (nothing
 * stripped) and the reasoning (*reasoning, *n_reasoning bytes) what precedes its first,
 * after the last "<think>" before that, line breaks stripped at both ends; true then.
 * Otherwise false, *answer the whole text and no reasoning.
 */
bool chat_think_parts(const char *content, const char **reasoning, size_t *n_reasoning,
                      const char **answer);

/*
 * Text that ends an assistant turn in this family ("<|im_end|>", "<|eot_id|>", "</s>",
 * "<|end_of_turn|>", "<|EOT|>", gpt-oss's "<|return|>"...; "\nUser:" for plain), for use
 * as a stop string when the tokenizer does not mark the corresponding token as
 * end-of-generation. Never NULL.
 */
const char *chat_stop_text(enum chat_family f);

#endif
