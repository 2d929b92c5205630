/* chat.c — chat template families (see chat.h). */
#include "engine/tok/chat.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/tok/chatharmony.h"
#include "engine/tok/chatthink.h"
#include "engine/tok/textwriter.h"

static const char *const family_names[] = {
    [CHAT_PLAIN] = "plain",
    [CHAT_CHATML] = "chatml",
    [CHAT_HERMES] = "hermes",
    [CHAT_LLAMA3] = "llama3",
    [CHAT_LLAMA2] = "llama2",
    [CHAT_LLAMA2_SYS] = "llama2-sys",
    [CHAT_LLAMA2_SYS_BOS] = "llama2-sys-bos",
    [CHAT_LLAMA2_SYS_STRIP] = "llama2-sys-strip",
    [CHAT_MISTRAL_V1] = "mistral-v1",
    [CHAT_MISTRAL_V3] = "mistral-v3",
    [CHAT_MISTRAL_V3_TEKKEN] = "mistral-v3-tekken",
    [CHAT_MISTRAL_V7] = "mistral-v7",
    [CHAT_ZEPHYR] = "zephyr",
    [CHAT_FALCON3] = "falcon3",
    [CHAT_DEEPSEEK3] = "deepseek3",
    [CHAT_OPENCHAT] = "openchat",
    [CHAT_VICUNA] = "vicuna",
    [CHAT_VICUNA_ORCA] = "vicuna-orca",
    [CHAT_DEEPSEEK] = "deepseek",
    [CHAT_MONARCH] = "monarch",
    [CHAT_MEGREZ] = "megrez",
    [CHAT_QWEN3] = "qwen3",
    [CHAT_QWEN3_THINKING] = "qwen3-thinking",
    [CHAT_PHI3] = "phi3",
    [CHAT_PHI4] = "phi4",
    [CHAT_GRANITE] = "granite",
    [CHAT_GEMMA] = "gemma",
    [CHAT_EXAONE3] = "exaone3",
    [CHAT_SMOLLM3] = "smollm3",
    [CHAT_GPT_OSS] = "gpt-oss",
    [CHAT_CHATGLM4] = "chatglm4",
    [CHAT_GLM_Z1] = "glm-z1",
    [CHAT_COMMAND_R] = "command-r",
    [CHAT_SEED_OSS] = "seed_oss",
    [CHAT_HUNYUAN_DENSE] = "hunyuan-dense",
    [CHAT_CHATGLM3] = "chatglm3",
    [CHAT_MISTRAL_V7_TEKKEN] = "mistral-v7-tekken",
    [CHAT_DEEPSEEK2] = "deepseek2",
    [CHAT_GLM_4_7] = "glm-4.7",
    [CHAT_ERNIE4_5] = "ernie4_5",
    [CHAT_GLM_4_5] = "glm-4.5",
};

#define N_FAMILIES ((int)(sizeof family_names / sizeof family_names[0]))

/* Hunyuan's markers (fullwidth bars, '▁' for spaces; split where a hex escape would
 * swallow the letter after it) */
#define HY_USER "<\xef\xbd\x9c" "hy_User\xef\xbd\x9c>"
#define HY_ASSISTANT "<\xef\xbd\x9c" "hy_Assistant\xef\xbd\x9c>"
#define HY_PLACE_HOLDER(d) \
    "<\xef\xbd\x9c" "hy_place\xe2\x96\x81" "holder\xe2\x96\x81" "no\xe2\x96\x81" d "\xef\xbd\x9c>"
#define HY_SYSTEM_END HY_PLACE_HOLDER("3")
#define HY_TURN_END HY_PLACE_HOLDER("2")
_Static_assert(N_FAMILIES == CHAT_N_FAMILIES, "a family without a name");

/* chat_detect of the string under key (CHAT_PLAIN without one). */
static enum chat_family detect_key(const gguf_file *g, const char *key)
{
    gguf_str t;
    if (!gguf_get_str(g, key, &t))
        return CHAT_PLAIN;
    char *text = strndup(t.ptr, t.len);
    enum chat_family f = chat_detect(text);
    free(text);
    return f;
}

/* Whether the vocabulary holds every one of harmony's control tokens. */
static bool has_harmony_tokens(const gguf_file *g)
{
    static const char *const needed[] = {"<|start|>", "<|channel|>", "<|message|>",
                                         "<|end|>",   "<|return|>",  "<|call|>"};
    enum gguf_value_type type;
    uint64_t n;
    unsigned found = 0;
    if (!gguf_get_arr(g, "tokenizer.ggml.tokens", &type, &n) || type != GGUF_STRING)
        return false;
    for (uint64_t i = 0; i < n; i++) {
        gguf_str t;
        if (!gguf_arr_str(g, "tokenizer.ggml.tokens", i, &t) || t.len < 5 || t.ptr[0] != '<')
            continue;
        for (unsigned k = 0; k < sizeof needed / sizeof needed[0]; k++)
            if (gguf_str_eq(t, needed[k]))
                found |= 1u << k;
    }
    return found == (1u << (sizeof needed / sizeof needed[0])) - 1;
}

enum chat_family chat_detect_file(const gguf_file *g)
{
    enum chat_family f = detect_key(g, "tokenizer.chat_template");
    bool bare = f == CHAT_CHATML || gguf_find_key(g, "tokenizer.chat_template") < 0;
    if (bare && detect_key(g, "tokenizer.chat_template.tool_use") == CHAT_HERMES)
        return CHAT_HERMES;
    if (f == CHAT_PLAIN && has_harmony_tokens(g))
        return CHAT_GPT_OSS;
    return f;
}

const char *chat_family_name(enum chat_family f)
{
    return (int)f >= 0 && (int)f < N_FAMILIES ? family_names[f] : "unknown";
}

/* The [INST] families, told apart by the markers llama.cpp looks for. */
static enum chat_family detect_inst(const char *t)
{
    if (strstr(t, "[SYSTEM_PROMPT]"))
        return CHAT_MISTRAL_V7;
    if (strstr(t, "' [INST] ' + system_message") || strstr(t, "[AVAILABLE_TOOLS]")) {
        if (strstr(t, " [INST]"))
            return CHAT_MISTRAL_V1;
        if (strstr(t, "\"[INST]\""))
            return CHAT_MISTRAL_V3_TEKKEN;
        return CHAT_MISTRAL_V3;
    }
    if (strstr(t, "content.strip()"))
        return CHAT_LLAMA2_SYS_STRIP;
    if (strstr(t, "bos_token + '[INST]"))
        return CHAT_LLAMA2_SYS_BOS;
    if (strstr(t, "<<SYS>>"))
        return CHAT_LLAMA2_SYS;
    return CHAT_LLAMA2;
}

/* The "<|user|>" templates. TinyLlama's and zephyr's end every message with eos_token;
 * Falcon3's ends a user message with a newline, GLM-Edge's with nothing. llama.cpp tells
 * them apart by a literal "</s>", which none of them holds (the first two write
 * eos_token), and so takes TinyLlama's and Falcon3's for GLM-Edge's, an architecture
 * llmsd does not run; here the end of the user message decides: the template's text
 * from "<|user|>" to its next statement. */
static enum chat_family detect_user_tag(const char *t, const char *user)
{
    const char *next = strstr(user, "{%");
    size_t n = next ? (size_t)(next - user) : strlen(user);
    char span[512];
    if (n >= sizeof span)
        n = sizeof span - 1;
    memcpy(span, user, n);
    span[n] = '\0';
    if (strstr(span, "eos_token") || strstr(span, "</s>"))
        return CHAT_ZEPHYR;
    /* StableLM's zephyr writes its EOS as text; llmsd has no family for it */
    if (strstr(span, "<|endoftext|>"))
        return CHAT_PLAIN;
    /* a newline as a Jinja string: '\\n' or a real line break in quotes; "<|end|>" is
     * Phi-3's, another architecture that writes one too */
    if ((strstr(span, "'\\n'") || strstr(span, "'\n'")) && strstr(t, "<|assistant|>") &&
        !strstr(t, "<|end|>"))
        return CHAT_FALCON3;
    return CHAT_PLAIN;
}

enum chat_family chat_detect(const char *t)
{
    if (!t)
        return CHAT_PLAIN;
    for (int f = 0; f < N_FAMILIES; f++)
        if (strcmp(t, family_names[f]) == 0)
            return (enum chat_family)f;
    if (strstr(t, "<|start|>") && strstr(t, "<|channel|>") && strstr(t, "<|message|>"))
        return CHAT_GPT_OSS;
    if (strstr(t, "<|im_start|>")) {
        if (strstr(t, "Reasoning Mode") && strstr(t, "/no_think"))
            return CHAT_SMOLLM3;
        if (strstr(t, "<|im_sep|>"))
            return CHAT_PHI4;
        if (strstr(t, "You are a function calling AI model."))
            return CHAT_HERMES;
        if (!strstr(t, "</think>"))
            return CHAT_CHATML;
        /* the opening as a Jinja string writes it ('\n') or with a real line break */
        return strstr(t, "<|im_start|>assistant\\n<think>") ||
                       strstr(t, "<|im_start|>assistant\n<think>")
                   ? CHAT_QWEN3_THINKING
                   : CHAT_QWEN3;
    }
    if (strncmp(t, "mistral", 7) == 0 || strstr(t, "[INST]"))
        return detect_inst(t);
    /* the rest in llama.cpp's order, which matters where a template has two markers */
    if (strstr(t, "<|assistant|>") && strstr(t, "<|end|>"))
        return CHAT_PHI3;
    /* GLM-4.5's and 4.6's switch, which no other GLM template writes */
    if (strstr(t, "[gMASK]<sop>") && strstr(t, "/nothink"))
        return CHAT_GLM_4_5;
    /* GLM-4.5's tool calls, without 4.5's and 4.6's switch (they are not glm-4.7's turns) */
    if (strstr(t, "[gMASK]<sop>") && strstr(t, "<arg_key>") && !strstr(t, "/nothink"))
        return CHAT_GLM_4_7;
    /* GLM-Z1's generation prompt, with a real line break or a Jinja '\n' */
    if (strstr(t, "[gMASK]<sop>"))
        return strstr(t, "<|assistant|>\n<think>") || strstr(t, "<|assistant|>\\n<think>")
                   ? CHAT_GLM_Z1
                   : CHAT_CHATGLM4;
    if (strstr(t, "[gMASK]sop"))
        return CHAT_CHATGLM3;
    const char *user = strstr(t, "<|user|>");
    enum chat_family f = user ? detect_user_tag(t, user) : CHAT_PLAIN;
    if (f != CHAT_PLAIN)
        return f;
    if (strstr(t, "bos_token + message['role']"))
        return CHAT_MONARCH;
    if (strstr(t, "<start_of_turn>"))
        return CHAT_GEMMA;
    if (strstr(t, "GPT4 Correct "))
        return CHAT_OPENCHAT;
    if (strstr(t, "USER: ") && strstr(t, "ASSISTANT: "))
        return strstr(t, "SYSTEM: ") ? CHAT_VICUNA_ORCA : CHAT_VICUNA;
    if (strstr(t, "### Instruction:") && strstr(t, "<|EOT|>"))
        return CHAT_DEEPSEEK;
    if (strstr(t, "<|START_OF_TURN_TOKEN|>") && strstr(t, "<|USER_TOKEN|>"))
        return CHAT_COMMAND_R;
    if (strstr(t, "<|start_header_id|>") && strstr(t, "<|end_header_id|>"))
        return CHAT_LLAMA3;
    /* ERNIE 4.5's sentence markers (its cls_token and sep_token) around "User: " turns */
    if (strstr(t, "<|begin_of_sentence|>") && strstr(t, "<|end_of_sentence|>") &&
        strstr(t, "User: "))
        return CHAT_ERNIE4_5;
    /* DeepSeek-V2's reply, as llama.cpp recognises it (before deepseek3, as it does) */
    if (strstr(t, "'Assistant: ' + message['content'] + eos_token"))
        return CHAT_DEEPSEEK2;
    if (strstr(t, "<｜Assistant｜>") && strstr(t, "<｜User｜>") &&
        strstr(t, "<｜end▁of▁sentence｜>"))
        return CHAT_DEEPSEEK3;
    if (strstr(t, "<|role_start|>"))
        return CHAT_MEGREZ;
    if (strstr(t, "<|start_of_role|>"))
        return CHAT_GRANITE;
    if (strstr(t, "[|system|]") && strstr(t, "[|assistant|]") && strstr(t, "[|endofturn|]"))
        return CHAT_EXAONE3;
    if (strstr(t, "<seed:bos>"))
        return CHAT_SEED_OSS;
    /* HunyuanOCR's template has the assistant marker too, with its own sentence start */
    if (strstr(t, HY_ASSISTANT) && strstr(t, HY_SYSTEM_END) &&
        !strstr(t, "<\xef\xbd\x9c" "hy_begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"))
        return CHAT_HUNYUAN_DENSE;
    return CHAT_PLAIN;
}

const char *chat_stop_text(enum chat_family f)
{
    switch (f) {
    case CHAT_CHATML:
    case CHAT_HERMES:
    case CHAT_QWEN3:
    case CHAT_QWEN3_THINKING:
    case CHAT_SMOLLM3:
        return "<|im_end|>";
    case CHAT_EXAONE3:
        return "[|endofturn|]";
    case CHAT_LLAMA3:
        return "<|eot_id|>";
    case CHAT_FALCON3:
        return "<|endoftext|>";
    case CHAT_DEEPSEEK3:
    case CHAT_DEEPSEEK2:
        return "<｜end▁of▁sentence｜>";
    case CHAT_OPENCHAT:
        return "<|end_of_turn|>";
    case CHAT_DEEPSEEK:
        return "<|EOT|>";
    case CHAT_MEGREZ:
        return "<|turn_end|>";
    case CHAT_PHI3:
        return "<|end|>";
    case CHAT_PHI4:
        return "<|im_end|>";
    case CHAT_GRANITE:
        return "<|end_of_text|>";
    case CHAT_GEMMA:
        return "<end_of_turn>";
    case CHAT_GPT_OSS:
        return "<|return|>";
    case CHAT_CHATGLM4:
    case CHAT_GLM_Z1:
    case CHAT_CHATGLM3:
    case CHAT_GLM_4_7:
    case CHAT_GLM_4_5:
        return "<|user|>";
    case CHAT_ERNIE4_5:
        return "<|end_of_sentence|>";
    case CHAT_COMMAND_R:
        return "<|END_OF_TURN_TOKEN|>";
    case CHAT_SEED_OSS:
        return "<seed:eos>";
    case CHAT_HUNYUAN_DENSE:
        return HY_TURN_END;
    case CHAT_PLAIN:
        return "\nUser:";
    default:
        return "</s>";
    }
}

enum chat_think chat_thinking(enum chat_family f)
{
    switch (f) {
    case CHAT_QWEN3:
    case CHAT_DEEPSEEK3:
    case CHAT_SMOLLM3:
        return CHAT_THINK_REPLY;
    case CHAT_QWEN3_THINKING:
    case CHAT_GLM_Z1:
    case CHAT_GLM_4_7:
        return CHAT_THINK_OPENED;
    case CHAT_GPT_OSS:
        return CHAT_THINK_HARMONY;
    case CHAT_GLM_4_5:
        return CHAT_THINK_REPLY_SPACED;
    default:
        return CHAT_THINK_NONE;
    }
}

enum chat_think chat_thinking_for(enum chat_family f, bool enable_thinking)
{
    return f == CHAT_GLM_4_7 && !enable_thinking ? CHAT_THINK_REPLY : chat_thinking(f);
}

/* The last occurrence of needle in hay[0..n), or NULL. */
static const char *last_in(const char *hay, size_t n, const char *needle)
{
    const char *found = NULL;
    for (const char *p = hay; (p = memmem(p, n - (size_t)(p - hay), needle, strlen(needle)));
         p++)
        found = p;
    return found;
}

bool chat_think_parts(const char *content, const char **reasoning, size_t *n_reasoning,
                      const char **answer)
{
    static const char open[] = "<think>", close[] = "</think>";
    const char *first = strstr(content, close);
    *reasoning = content;
    *n_reasoning = 0;
    *answer = content;
    if (!first)
        return false;
    *answer = last_in(content, strlen(content), close) + sizeof close - 1;
    const char *r = last_in(content, (size_t)(first - content), open);
    r = r ? r + sizeof open - 1 : content;
    const char *e = first;
    while (r < e && *r == '\n')
        r++;
    while (e > r && e[-1] == '\n')
        e--;
    *reasoning = r;
    *n_reasoning = (size_t)(e - r);
    return true;
}

/* Content with leading and trailing whitespace removed (trim=true) or as is. */
static void put_content(textwriter *w, const char *s, bool trim)
{
    if (trim)
        textwriter_put_trimmed(w, s);
    else
        textwriter_put(w, s);
}

enum role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_BAD };

static enum role role_of(const struct chat_message *m)
{
    if (!m->role || !m->content)
        return ROLE_BAD;
    if (strcmp(m->role, "system") == 0)
        return ROLE_SYSTEM;
    if (strcmp(m->role, "user") == 0)
        return ROLE_USER;
    if (strcmp(m->role, "assistant") == 0)
        return ROLE_ASSISTANT;
    return ROLE_BAD;
}

static void apply_llama2(textwriter *w, enum chat_family f, const struct chat_message *msgs, int n)
{
    bool sys_block = f != CHAT_LLAMA2;
    bool bos_inside = f == CHAT_LLAMA2_SYS_BOS;
    bool strip = f == CHAT_LLAMA2_SYS_STRIP;
    bool in_turn = true; /* the first "[INST]" follows the BOS the tokenizer adds */
    textwriter_put(w, "[INST] ");
    for (int i = 0; i < n; i++) {
        if (!in_turn) {
            textwriter_put(w, bos_inside ? "<s>[INST] " : "[INST] ");
            in_turn = true;
        }
        switch (role_of(&msgs[i])) {
        case ROLE_SYSTEM:
            textwriter_put(w, sys_block ? "<<SYS>>\n" : "");
            put_content(w, msgs[i].content, strip);
            textwriter_put(w, sys_block ? "\n<</SYS>>\n\n" : "\n");
            break;
        case ROLE_USER:
            put_content(w, msgs[i].content, strip);
            textwriter_put(w, " [/INST]");
            break;
        default:
            put_content(w, msgs[i].content, strip);
            textwriter_put(w, "</s>");
            in_turn = false;
        }
    }
}

static void apply_mistral(textwriter *w, enum chat_family f, const struct chat_message *msgs, int n)
{
    const char *lead = f == CHAT_MISTRAL_V1 ? " " : "";
    const char *trail = f == CHAT_MISTRAL_V3_TEKKEN ? "" : " ";
    bool in_turn = false;
    for (int i = 0; i < n; i++) {
        if (!in_turn) {
            textwriter_put(w, lead);
            textwriter_put(w, "[INST]");
            textwriter_put(w, trail);
            in_turn = true;
        }
        switch (role_of(&msgs[i])) {
        case ROLE_SYSTEM:
            textwriter_put(w, msgs[i].content);
            textwriter_put(w, "\n\n");
            break;
        case ROLE_USER:
            textwriter_put(w, msgs[i].content);
            textwriter_put(w, lead);
            textwriter_put(w, "[/INST]");
            break;
        default:
            textwriter_put(w, trail);
            put_content(w, msgs[i].content, f == CHAT_MISTRAL_V3);
            textwriter_put(w, "</s>");
            in_turn = false;
        }
    }
}

/* The families whose every message is an opening, its content as it is and a closing,
 * both chosen by the role (system, user, assistant), and whose generation prompt is a
 * fixed text ("" where the user's closing opens the reply already); `later` goes before
 * every message but the first (monarch's "<s>": the tokenizer adds the first). */
struct turn_format {
    const char *open[3], *close[3], *gen, *later;
};

static const struct turn_format turn_formats[CHAT_N_FAMILIES] = {
    [CHAT_PLAIN] = {{"System: ", "User: ", "Assistant: "}, {"\n", "\n", "\n"}, "Assistant:", ""},
    [CHAT_CHATML] = {{"<|im_start|>system\n", "<|im_start|>user\n", "<|im_start|>assistant\n"},
                     {"<|im_end|>\n", "<|im_end|>\n", "<|im_end|>\n"},
                     "<|im_start|>assistant\n", ""},
    /* Hermes' default template, for chats without tools, is chatml */
    [CHAT_HERMES] = {{"<|im_start|>system\n", "<|im_start|>user\n", "<|im_start|>assistant\n"},
                     {"<|im_end|>\n", "<|im_end|>\n", "<|im_end|>\n"},
                     "<|im_start|>assistant\n", ""},
    [CHAT_MISTRAL_V7] = {{"[SYSTEM_PROMPT] ", "[INST] ", " "},
                         {"[/SYSTEM_PROMPT]", "[/INST]", "</s>"}, "", ""},
    [CHAT_MISTRAL_V7_TEKKEN] = {{"[SYSTEM_PROMPT]", "[INST]", ""},
                                {"[/SYSTEM_PROMPT]", "[/INST]", "</s>"}, "", ""},
    [CHAT_ZEPHYR] = {{"<|system|>\n", "<|user|>\n", "<|assistant|>\n"},
                     {"</s>\n", "</s>\n", "</s>\n"}, "<|assistant|>\n", ""},
    [CHAT_FALCON3] = {{"<|system|>\n", "<|user|>\n", "<|assistant|>\n"},
                      {"\n", "\n", "\n"}, "<|assistant|>\n", ""},
    [CHAT_DEEPSEEK3] = {{"", "<｜User｜>", "<｜Assistant｜>"},
                        {"\n\n", "", "<｜end▁of▁sentence｜>"}, "<｜Assistant｜>", ""},
    [CHAT_DEEPSEEK2] = {{"", "User: ", "Assistant: "},
                        {"\n\n", "\n\n", "<｜end▁of▁sentence｜>"}, "Assistant:", ""},
    /* OpenChat's own template writes "GPT4 Correct System: "; llama.cpp follows the
     * authors' advice of a bare system message */
    [CHAT_OPENCHAT] = {{"", "GPT4 Correct User: ", "GPT4 Correct Assistant: "},
                       {"<|end_of_turn|>", "<|end_of_turn|>", "<|end_of_turn|>"},
                       "GPT4 Correct Assistant:", ""},
    [CHAT_VICUNA] = {{"", "USER: ", "ASSISTANT: "}, {"\n\n", "\n", "</s>\n"}, "ASSISTANT:", ""},
    [CHAT_VICUNA_ORCA] = {{"SYSTEM: ", "USER: ", "ASSISTANT: "}, {"\n", "\n", "</s>\n"},
                          "ASSISTANT:", ""},
    [CHAT_DEEPSEEK] = {{"", "### Instruction:\n", "### Response:\n"},
                       {"", "\n", "\n<|EOT|>\n"}, "### Response:\n", ""},
    [CHAT_MONARCH] = {{"system\n", "user\n", "assistant\n"}, {"</s>\n", "</s>\n", "</s>\n"},
                      "<s>assistant\n", "<s>"},
    [CHAT_MEGREZ] = {{"<|role_start|>system<|role_end|>", "<|role_start|>user<|role_end|>",
                      "<|role_start|>assistant<|role_end|>"},
                     {"<|turn_end|>", "<|turn_end|>", "<|turn_end|>"},
                     "<|role_start|>assistant<|role_end|>", ""},
    [CHAT_PHI3] = {{"<|system|>\n", "<|user|>\n", "<|assistant|>\n"},
                   {"<|end|>\n", "<|end|>\n", "<|end|>\n"}, "<|assistant|>\n", ""},
    [CHAT_PHI4] = {{"<|im_start|>system<|im_sep|>", "<|im_start|>user<|im_sep|>",
                    "<|im_start|>assistant<|im_sep|>"},
                   {"<|im_end|>", "<|im_end|>", "<|im_end|>"}, "<|im_start|>assistant<|im_sep|>",
                   ""},
    [CHAT_GRANITE] = {{"<|start_of_role|>system<|end_of_role|>",
                       "<|start_of_role|>user<|end_of_role|>",
                       "<|start_of_role|>assistant<|end_of_role|>"},
                      {"<|end_of_text|>\n", "<|end_of_text|>\n", "<|end_of_text|>\n"},
                      "<|start_of_role|>assistant<|end_of_role|>", ""},
    /* after the "<|begin_of_sentence|>" apply_ernie45 writes first */
    [CHAT_ERNIE4_5] = {{"", "User: ", "Assistant: "}, {"\n", "\n", "<|end_of_sentence|>"},
                       "Assistant: ", ""},
};

/* answer_only: an assistant message is written without its reasoning, what follows its
 * last "</think>" (the R1 distills' template). */
static void apply_turns(textwriter *w, const struct turn_format *tf, const struct chat_message *msgs,
                        int n, bool gen, bool answer_only)
{
    for (int i = 0; i < n; i++) {
        enum role r = role_of(&msgs[i]);
        const char *reasoning, *text = msgs[i].content;
        size_t n_reasoning;
        if (answer_only && r == ROLE_ASSISTANT)
            chat_think_parts(msgs[i].content, &reasoning, &n_reasoning, &text);
        textwriter_put(w, i > 0 ? tf->later : "");
        textwriter_put(w, tf->open[r]);
        textwriter_put(w, text);
        textwriter_put(w, tf->close[r]);
    }
    if (gen)
        textwriter_put(w, tf->gen);
}

/* Qwen3's template (chat.h): the first system message, then each message as a chatml
 * turn but assistant ones, written as chatthink_put_reply says. */
static void apply_qwen3(textwriter *w, enum chat_family f, const struct chat_message *msgs,
                        int n, bool gen, bool enable_thinking)
{
    int last_query = n - 1;
    for (int i = n - 1; i >= 0; i--)
        if (chatthink_is_query(msgs[i].role, msgs[i].content)) {
            last_query = i;
            break;
        }
    for (int i = 0; i < n; i++) {
        if (role_of(&msgs[i]) == ROLE_ASSISTANT) {
            chatthink_put_reply(w, msgs[i].content, i > last_query, i == n - 1);
            textwriter_put(w, "<|im_end|>\n");
            continue;
        }
        textwriter_put(w, "<|im_start|>");
        textwriter_put(w, msgs[i].role);
        textwriter_put(w, "\n");
        textwriter_put(w, msgs[i].content);
        textwriter_put(w, "<|im_end|>\n");
    }
    if (!gen)
        return;
    textwriter_put(w, "<|im_start|>assistant\n");
    if (f == CHAT_QWEN3_THINKING)
        textwriter_put(w, "<think>\n");
    else if (!enable_thinking)
        textwriter_put(w, "<think>\n\n</think>\n\n");
}

/* Gemma's turns, as llama.cpp's LLM_CHAT_TEMPLATE_GEMMA writes them: a system message is
 * held (trimmed; a later one replaces it) until the next turn that is not the model's,
 * which it opens with "\n\n" after it. */
static void apply_gemma(textwriter *w, const struct chat_message *msgs, int n, bool gen)
{
    const char *sys = NULL;
    for (int i = 0; i < n; i++) {
        enum role r = role_of(&msgs[i]);
        if (r == ROLE_SYSTEM) {
            sys = msgs[i].content;
            continue;
        }
        textwriter_put(w, "<start_of_turn>");
        textwriter_put(w, r == ROLE_ASSISTANT ? "model" : msgs[i].role);
        textwriter_put(w, "\n");
        if (sys && r != ROLE_ASSISTANT) {
            size_t before = w->len;
            textwriter_put_trimmed(w, sys);
            if (w->len > before) /* an empty one is no prompt (llama.cpp's check) */
                textwriter_put(w, "\n\n");
            sys = NULL;
        }
        textwriter_put_trimmed(w, msgs[i].content);
        textwriter_put(w, "<end_of_turn>\n");
    }
    if (gen)
        textwriter_put(w, "<start_of_turn>model\n");
}

/* gpt-oss's prompt of plain messages: today's date, the default effort, no tools. */
static int apply_gpt_oss(const struct chat_message *msgs, int n, bool gen, char *out, size_t cap)
{
    struct chat_tool_message *tm = calloc(n > 0 ? (size_t)n : 1, sizeof *tm);
    if (!tm)
        return -1;
    for (int i = 0; i < n; i++)
        tm[i] = (struct chat_tool_message){msgs[i].role, msgs[i].content, NULL, 0, NULL};
    char date[16];
    time_t now = time(NULL);
    struct tm day;
    if (!localtime_r(&now, &day))
        memset(&day, 0, sizeof day);
    snprintf(date, sizeof date, "%04d-%02d-%02d", (day.tm_year + 1900) % 10000,
             (day.tm_mon + 1) % 100, day.tm_mday % 100);
    struct chat_harmony_opts o = {date, NULL, NULL};
    int rc = chat_harmony_apply(&o, NULL, 0, tm, n, gen, out, cap);
    free(tm);
    return rc;
}

/* EXAONE 3's turns, as llama.cpp's LLM_CHAT_TEMPLATE_EXAONE_3 writes them. */
static void apply_exaone3(textwriter *w, const struct chat_message *msgs, int n, bool gen)
{
    static const char *const open[] = {"[|system|]", "[|user|]", "[|assistant|]"};
    static const char *const close[] = {"[|endofturn|]\n", "\n", "[|endofturn|]\n"};
    for (int i = 0; i < n; i++) {
        enum role r = role_of(&msgs[i]);
        textwriter_put(w, open[r]);
        textwriter_put_trimmed(w, msgs[i].content);
        textwriter_put(w, close[r]);
    }
    if (gen)
        textwriter_put(w, "[|assistant|]");
}

/* GLM-4's turns: llama.cpp's chatglm4 format, or GLM-Z1's template (glm-z1: the
 * system messages first, then the others' text after their last "</think>", stripped,
 * and a generation prompt that opens the think block). */
static void apply_glm4(textwriter *w, enum chat_family f, const struct chat_message *msgs, int n,
                       bool gen)
{
    bool z1 = f == CHAT_GLM_Z1;
    textwriter_put(w, "[gMASK]<sop>");
    for (int pass = z1 ? 0 : 1; pass < 2; pass++)
        for (int i = 0; i < n; i++) {
            bool sys = role_of(&msgs[i]) == ROLE_SYSTEM;
            if (z1 && sys != (pass == 0))
                continue;
            const char *reasoning, *text = msgs[i].content;
            size_t n_reasoning;
            textwriter_put(w, "<|");
            textwriter_put(w, msgs[i].role);
            textwriter_put(w, "|>\n");
            if (z1 && !sys) {
                chat_think_parts(msgs[i].content, &reasoning, &n_reasoning, &text);
                textwriter_put_trimmed(w, text);
            } else {
                textwriter_put(w, text);
            }
        }
    if (gen)
        textwriter_put(w, z1 ? "<|assistant|>\n<think>" : "<|assistant|>\n");
}

/* The index of the last user message, or -1 (GLM-4.5's and 4.7's templates keep an
 * assistant message's reasoning after it alone). */
static int last_user_message(const struct chat_message *msgs, int n)
{
    int last = -1;
    for (int i = 0; i < n; i++)
        if (role_of(&msgs[i]) == ROLE_USER)
            last = i;
    return last;
}

/* GLM-4.7's template (chat.h): an assistant message's block kept after the last user
 * message alone. */
static void apply_glm47(textwriter *w, const struct chat_message *msgs, int n, bool gen,
                        bool enable_thinking)
{
    int last_user = last_user_message(msgs, n);
    textwriter_put(w, "[gMASK]<sop>");
    for (int i = 0; i < n; i++) {
        textwriter_put(w, "<|");
        textwriter_put(w, msgs[i].role);
        textwriter_put(w, "|>");
        if (role_of(&msgs[i]) != ROLE_ASSISTANT) {
            textwriter_put(w, msgs[i].content);
            continue;
        }
        const char *reasoning, *answer;
        size_t n_reasoning;
        chat_think_parts(msgs[i].content, &reasoning, &n_reasoning, &answer);
        if (i > last_user && n_reasoning > 0) {
            textwriter_put(w, "<think>");
            textwriter_put_trimmed_n(w, reasoning, n_reasoning);
        }
        textwriter_put(w, "</think>");
        textwriter_put_trimmed(w, answer);
    }
    if (gen)
        textwriter_put(w, enable_thinking ? "<|assistant|><think>" : "<|assistant|></think>");
}

/* ERNIE 4.5's template (chat.h): its cls_token, which the template writes itself (the
 * vocabulary's BOS is "<s>"), then turn_formats' turns. */
static void apply_ernie45(textwriter *w, const struct chat_message *msgs, int n, bool gen)
{
    textwriter_put(w, "<|begin_of_sentence|>");
    apply_turns(w, &turn_formats[CHAT_ERNIE4_5], msgs, n, gen, false);
}

/* Whether s ends with suffix. */
static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

/* A GLM-4.5 assistant message: its block, with its reasoning where keep_reasoning (empty
 * otherwise), and its answer on a line of its own where that is not empty. */
static void put_glm45_reply(textwriter *w, const char *content, bool keep_reasoning)
{
    const char *reasoning, *answer;
    size_t n_reasoning;
    chat_think_parts(content, &reasoning, &n_reasoning, &answer);
    textwriter_put(w, "<|assistant|>\n<think>");
    if (keep_reasoning)
        textwriter_put_trimmed_n(w, reasoning, n_reasoning);
    textwriter_put(w, "</think>");
    while (textwriter_is_space(*answer))
        answer++;
    if (*answer) {
        textwriter_put(w, "\n");
        textwriter_put_trimmed(w, answer);
    }
}

/* GLM-4.5's and 4.6's template (chat.h): an assistant message's reasoning kept after the
 * last user message alone. */
static void apply_glm45(textwriter *w, const struct chat_message *msgs, int n, bool gen,
                        bool enable_thinking)
{
    int last_user = last_user_message(msgs, n);
    textwriter_put(w, "[gMASK]<sop>");
    for (int i = 0; i < n; i++) {
        switch (role_of(&msgs[i])) {
        case ROLE_SYSTEM:
            textwriter_put(w, "<|system|>\n");
            textwriter_put(w, msgs[i].content);
            break;
        case ROLE_USER:
            textwriter_put(w, "<|user|>\n");
            textwriter_put(w, msgs[i].content);
            if (!enable_thinking && !ends_with(msgs[i].content, "/nothink"))
                textwriter_put(w, "/nothink");
            break;
        default:
            put_glm45_reply(w, msgs[i].content, i > last_user);
            break;
        }
    }
    if (gen)
        textwriter_put(w, enable_thinking ? "<|assistant|>" : "<|assistant|>\n<think></think>");
}

/* ChatGLM3's turns, as llama.cpp's LLM_CHAT_TEMPLATE_CHATGLM_3 writes them. */
static void apply_chatglm3(textwriter *w, const struct chat_message *msgs, int n, bool gen)
{
    textwriter_put(w, "[gMASK]sop");
    for (int i = 0; i < n; i++) {
        textwriter_put(w, "<|");
        textwriter_put(w, msgs[i].role);
        textwriter_put(w, "|>\n ");
        textwriter_put(w, msgs[i].content);
    }
    if (gen)
        textwriter_put(w, "<|assistant|>");
}

/* Cohere's turns, as llama.cpp's LLM_CHAT_TEMPLATE_COMMAND_R writes them. */
static void apply_command_r(textwriter *w, const struct chat_message *msgs, int n, bool gen)
{
    static const char *const open[] = {"<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>",
                                       "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>",
                                       "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"};
    for (int i = 0; i < n; i++) {
        textwriter_put(w, open[role_of(&msgs[i])]);
        textwriter_put_trimmed(w, msgs[i].content);
        textwriter_put(w, "<|END_OF_TURN_TOKEN|>");
    }
    if (gen)
        textwriter_put(w, open[ROLE_ASSISTANT]);
}

/* Seed-OSS's turns, as llama.cpp's LLM_CHAT_TEMPLATE_SEED_OSS writes them. */
static void apply_seed_oss(textwriter *w, const struct chat_message *msgs, int n, bool gen)
{
    for (int i = 0; i < n; i++) {
        textwriter_put(w, "<seed:bos>");
        textwriter_put(w, msgs[i].role);
        textwriter_put(w, "\n");
        if (role_of(&msgs[i]) == ROLE_ASSISTANT)
            textwriter_put_trimmed(w, msgs[i].content);
        else
            textwriter_put(w, msgs[i].content);
        textwriter_put(w, "<seed:eos>");
    }
    if (gen)
        textwriter_put(w, "<seed:bos>assistant\n");
}

/* Hunyuan's dense models' turns, as llama.cpp's LLM_CHAT_TEMPLATE_HUNYUAN_DENSE writes
 * them (chat.h). */
static void apply_hunyuan_dense(textwriter *w, const struct chat_message *msgs, int n)
{
    for (int i = 0; i < n; i++) {
        enum role r = role_of(&msgs[i]);
        if (r == ROLE_SYSTEM && i == 0) {
            textwriter_put(w, msgs[i].content);
            textwriter_put(w, HY_SYSTEM_END);
        } else if (r == ROLE_ASSISTANT) {
            textwriter_put(w, HY_ASSISTANT);
            textwriter_put(w, msgs[i].content);
            textwriter_put(w, HY_TURN_END);
        } else if (r == ROLE_USER) {
            textwriter_put(w, HY_USER);
            textwriter_put(w, msgs[i].content);
            textwriter_put(w, HY_ASSISTANT);
        }
    }
}

/* SmolLM3's custom instructions for its "/think" mode when the system message gives none
 * (its template's text). */
static const char smollm3_think_default[] =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face. Your role as an "
    "assistant involves thoroughly exploring questions through a systematic thinking process "
    "before providing the final precise and accurate solutions. This requires engaging in a "
    "comprehensive cycle of analysis, summarizing, exploration, reassessment, reflection, "
    "backtracking, and iteration to develop well-considered thinking process. Please "
    "structure your response into two main sections: Thought and Solution using the "
    "specified format: <think> Thought section </think> Solution section. In the Thought "
    "section, detail your reasoning process in steps. Each step should include detailed "
    "considerations such as analysing questions, summarizing relevant findings, "
    "brainstorming new ideas, verifying the accuracy of the current steps, refining any "
    "errors, and revisiting previous steps. In the Solution section, based on various "
    "attempts, explorations, and reflections from the Thought section, systematically "
    "present the final solution that you deem correct. The Solution section should be "
    "logical, accurate, and concise and detail necessary steps needed to reach the "
    "conclusion.";

/* s with every `cut` removed in place (Python's str.replace(cut, "")). */
static void cut_all(char *s, const char *cut)
{
    size_t n = strlen(cut);
    char *p;
    while ((p = strstr(s, cut)))
        memmove(p, p + n, strlen(p + n) + 1);
}

/* s without trailing whitespace (Python's rstrip()), in place. */
static void rstrip(char *s)
{
    size_t n = strlen(s);
    while (n > 0 && strchr(" \t\n\r\v\f", s[n - 1]))
        s[--n] = '\0';
}

/* SmolLM3's template (chat.h): -1 when the system message's copy cannot be had. */
static int apply_smollm3(textwriter *w, const struct chat_message *msgs, int n, bool gen,
                         bool enable_thinking)
{
    const char *sys = n > 0 && role_of(&msgs[0]) == ROLE_SYSTEM ? msgs[0].content : NULL;
    bool think = enable_thinking;
    char *custom = NULL;
    if (sys) {
        if (strstr(sys, "/no_think"))
            think = false;
        else if (strstr(sys, "/think"))
            think = true;
        /* the template's system_message.replace("/no_think", "").replace("/think", "") */
        custom = strdup(sys);
        if (!custom)
            return -1;
        cut_all(custom, "/no_think");
        cut_all(custom, "/think");
        rstrip(custom);
    }
    textwriter_put(w, "<|im_start|>system\n");
    if (sys && strstr(sys, "/system_override")) {
        cut_all(custom, "/system_override");
        rstrip(custom);
        textwriter_put(w, custom);
        textwriter_put(w, "<|im_end|>\n");
    } else {
        /* the template's strftime_now("%d %B %Y"): the local date */
        char today[64] = "";
        time_t now = time(NULL);
        struct tm tm;
        if (localtime_r(&now, &tm))
            strftime(today, sizeof today, "%d %B %Y", &tm);
        textwriter_put(w, "## Metadata\n\nKnowledge Cutoff Date: June 2025\nToday Date: ");
        textwriter_put(w, today);
        textwriter_put(w, think ? "\nReasoning Mode: /think\n\n" : "\nReasoning Mode: /no_think\n\n");
        textwriter_put(w, "## Custom Instructions\n\n");
        textwriter_put(w, custom && custom[0] ? custom
                          : think ? smollm3_think_default
                                  : "You are a helpful AI assistant named SmolLM, trained by "
                                    "Hugging Face.");
        textwriter_put(w, "\n\n");
    }
    free(custom);
    /* the loop writes user and assistant messages; system ones are the block's alone */
    for (int i = 0; i < n; i++) {
        enum role r = role_of(&msgs[i]);
        if (r == ROLE_SYSTEM)
            continue;
        textwriter_put(w, r == ROLE_USER ? "<|im_start|>user\n" : "<|im_start|>assistant\n");
        const char *text = msgs[i].content;
        if (r == ROLE_ASSISTANT) {
            textwriter_put(w, think ? "" : "<think>\n\n</think>\n");
            while (*text == '\n') /* content.lstrip("\n") */
                text++;
        }
        textwriter_put(w, text);
        textwriter_put(w, "<|im_end|>\n");
    }
    if (gen)
        textwriter_put(w, think ? "<|im_start|>assistant\n"
                                : "<|im_start|>assistant\n<think>\n\n</think>\n");
    return 0;
}

int chat_apply(enum chat_family f, const struct chat_message *msgs, int n,
               bool add_generation_prompt, char *out, size_t cap)
{
    return chat_apply_think(f, msgs, n, add_generation_prompt, true, out, cap);
}

int chat_apply_think(enum chat_family f, const struct chat_message *msgs, int n,
                     bool add_generation_prompt, bool enable_thinking, char *out, size_t cap)
{
    if ((int)f < 0 || (int)f >= N_FAMILIES || n < 0 || (n > 0 && !msgs) || (cap > 0 && !out))
        return -1;
    for (int i = 0; i < n; i++)
        if (role_of(&msgs[i]) == ROLE_BAD)
            return -1;

    if (f == CHAT_GPT_OSS)
        return apply_gpt_oss(msgs, n, add_generation_prompt, out, cap);
    textwriter w = {out, cap, 0};
    switch (f) {
    case CHAT_LLAMA3:
        for (int i = 0; i < n; i++) {
            textwriter_put(&w, "<|start_header_id|>");
            textwriter_put(&w, msgs[i].role);
            textwriter_put(&w, "<|end_header_id|>\n\n");
            put_content(&w, msgs[i].content, true);
            textwriter_put(&w, "<|eot_id|>");
        }
        if (add_generation_prompt)
            textwriter_put(&w, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case CHAT_LLAMA2:
    case CHAT_LLAMA2_SYS:
    case CHAT_LLAMA2_SYS_BOS:
    case CHAT_LLAMA2_SYS_STRIP:
        apply_llama2(&w, f, msgs, n);
        break;
    case CHAT_MISTRAL_V1:
    case CHAT_MISTRAL_V3:
    case CHAT_MISTRAL_V3_TEKKEN:
        apply_mistral(&w, f, msgs, n);
        break;
    case CHAT_QWEN3:
    case CHAT_QWEN3_THINKING:
        apply_qwen3(&w, f, msgs, n, add_generation_prompt, enable_thinking);
        break;
    case CHAT_GEMMA:
        apply_gemma(&w, msgs, n, add_generation_prompt);
        break;
    case CHAT_EXAONE3:
        apply_exaone3(&w, msgs, n, add_generation_prompt);
        break;
    case CHAT_COMMAND_R:
        apply_command_r(&w, msgs, n, add_generation_prompt);
        break;
    case CHAT_SEED_OSS:
        apply_seed_oss(&w, msgs, n, add_generation_prompt);
        break;
    case CHAT_HUNYUAN_DENSE:
        apply_hunyuan_dense(&w, msgs, n);
        break;
    case CHAT_CHATGLM3:
        apply_chatglm3(&w, msgs, n, add_generation_prompt);
        break;
    case CHAT_SMOLLM3:
        if (apply_smollm3(&w, msgs, n, add_generation_prompt, enable_thinking) < 0)
            return -1;
        break;
    case CHAT_CHATGLM4:
    case CHAT_GLM_Z1:
        apply_glm4(&w, f, msgs, n, add_generation_prompt);
        break;
    case CHAT_GLM_4_7:
        apply_glm47(&w, msgs, n, add_generation_prompt, enable_thinking);
        break;
    case CHAT_ERNIE4_5:
        apply_ernie45(&w, msgs, n, add_generation_prompt);
        break;
    case CHAT_GLM_4_5:
        apply_glm45(&w, msgs, n, add_generation_prompt, enable_thinking);
        break;
    default: /* the families turn_formats writes */
        apply_turns(&w, &turn_formats[f], msgs, n, add_generation_prompt, f == CHAT_DEEPSEEK3);
        break;
    }
    if (cap > 0)
        out[w.len < cap ? w.len : cap - 1] = '\0';
    return w.len > INT_MAX ? -1 : (int)w.len;
}
