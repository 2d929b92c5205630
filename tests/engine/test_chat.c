/* Tests of chat template detection and formatting. Expected outputs are those of
 * llama.cpp's llm_chat_apply_template() for the same conversation. */
#include <string.h>

#include "engine/tok/chat.h"
#include "tests/support/test.h"

/* Distinctive parts of real tokenizer.chat_template values. */
static const char QWEN2[] =
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a "
    "helpful assistant.<|im_end|>\\n' }}\n"
    "{%- for message in messages %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + "
    "'\\n' }}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n";

static const char LLAMA3[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "
    "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = "
    "bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt "
    "%}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

/* meta-llama/Llama-2-7b-chat-hf */
static const char LLAMA2_CHAT[] =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
    "system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages "
    "%}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if "
    "loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + "
    "system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content "
    "= message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + "
    "'[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' "
    "%}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

/* mistralai/Mistral-7B-Instruct-v0.2 (the early template without a system prompt) */
static const char MISTRAL_OLD[] =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ "
    "'[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' "
    "%}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and "
    "assistant roles are supported!') }}{% endif %}{% endfor %}";

/* TheBloke/FusionNet_34Bx2_MoE-AWQ */
static const char FUSIONNET[] =
    "{%- for idx in range(0, messages|length) -%}\n{%- if messages[idx]['role'] == 'user' "
    "-%}\n{%- if idx > 1 -%}\n{{- bos_token + '[INST] ' + messages[idx]['content'] + ' "
    "[/INST]' -}}\n{%- else -%}\n{{- messages[idx]['content'] + ' [/INST]' -}}\n{%- endif "
    "-%}\n{% elif messages[idx]['role'] == 'system' %}\n{{- '[INST] <<SYS>>\\n' + "
    "messages[idx]['content'] + '\\n<</SYS>>\\n\\n' -}}\n";

/* Mistral's official v1 template (Mistral-7B-Instruct-v0.2, later revision) */
static const char MISTRAL_V1[] =
    "{%- if loop.first and system_message is defined %}\n"
    "            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n"
    "        {%- else %}\n            {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n";

/* Mistral-Large-Instruct-2407 (v3) and Mistral-Nemo-Instruct-2407 (v3-tekken) */
static const char MISTRAL_V3[] =
    "{{- \"[AVAILABLE_TOOLS] [\" }}{%- if loop.last and system_message is defined %}\n"
    "            {{- \"[INST] \" + system_message + \"\\n\\n\" + message[\"content\"] + "
    "\"[/INST]\" }}";
static const char MISTRAL_V3_TEKKEN[] =
    "{{- \"[AVAILABLE_TOOLS][\" }}{%- if loop.last and system_message is defined %}\n"
    "            {{- \"[INST]\" + system_message + \"\\n\\n\" + message[\"content\"] + "
    "\"[/INST]\" }}";

/* Mistral-Large-Instruct-2411 (v7) */
static const char MISTRAL_V7[] =
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ "
    "'[INST] ' + message['content'] + '[/INST]' }}{% elif message['role'] == 'system' %}{{ "
    "'[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' }}";

/* TinyLlama-1.1B-Chat (zephyr style): not a family handled here */
static const char ZEPHYR[] =
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\\n' + "
    "message['content'] + eos_token }}\n{% endif %}\n{% if loop.last and "
    "add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}";

static void detects_real_templates(void)
{
    CHECK_EQ(chat_detect(QWEN2), CHAT_CHATML);
    CHECK_EQ(chat_detect(LLAMA3), CHAT_LLAMA3);
    CHECK_EQ(chat_detect(LLAMA2_CHAT), CHAT_LLAMA2_SYS_STRIP);
    CHECK_EQ(chat_detect(MISTRAL_OLD), CHAT_LLAMA2);
    CHECK_EQ(chat_detect(FUSIONNET), CHAT_LLAMA2_SYS_BOS);
    CHECK_EQ(chat_detect("[INST] <<SYS>>\\n{{ system }}\\n<</SYS>>"), CHAT_LLAMA2_SYS);
    CHECK_EQ(chat_detect(MISTRAL_V1), CHAT_MISTRAL_V1);
    CHECK_EQ(chat_detect(MISTRAL_V3), CHAT_MISTRAL_V3);
    CHECK_EQ(chat_detect(MISTRAL_V3_TEKKEN), CHAT_MISTRAL_V3_TEKKEN);
    CHECK_EQ(chat_detect(MISTRAL_V7), CHAT_MISTRAL_V7);
    CHECK_EQ(chat_detect(ZEPHYR), CHAT_PLAIN);
    CHECK_EQ(chat_detect(""), CHAT_PLAIN);
    CHECK_EQ(chat_detect(NULL), CHAT_PLAIN);
}

static void detects_family_names(void)
{
    for (int f = CHAT_PLAIN; f <= CHAT_MISTRAL_V7; f++)
        CHECK_MSG((int)chat_detect(chat_family_name(f)) == f, "name %s", chat_family_name(f));
    CHECK(strcmp(chat_family_name(CHAT_LLAMA2_SYS), "llama2-sys") == 0);
    CHECK(strcmp(chat_family_name((enum chat_family)99), "unknown") == 0);
}

static const struct chat_message CONV[] = {
    {"system", "You are a helpful assistant"},
    {"user", "Hello"},
    {"assistant", "Hi there"},
    {"user", "Who are you"},
    {"assistant", "   I am an assistant   "},
    {"user", "Another question"},
};
#define N_CONV ((int)(sizeof CONV / sizeof CONV[0]))

static const struct {
    enum chat_family f;
    const char *expected;
} CASES[] = {
    {CHAT_CHATML,
     "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|"
     "im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are "
     "you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|"
     ">user\nAnother question<|im_end|>\n<|im_start|>assistant\n"},
    {CHAT_LLAMA3,
     "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful "
     "assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_"
     "header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>user<|"
     "end_header_id|>\n\nWho are "
     "you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am an "
     "assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother "
     "question<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {CHAT_LLAMA2,
     "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are you "
     "[/INST]   I am an assistant   </s>[INST] Another question [/INST]"},
    {CHAT_LLAMA2_SYS,
     "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi "
     "there</s>[INST] Who are you [/INST]   I am an assistant   </s>[INST] Another "
     "question [/INST]"},
    {CHAT_LLAMA2_SYS_BOS,
     "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi "
     "there</s><s>[INST] Who are you [/INST]   I am an assistant   </s><s>[INST] Another "
     "question [/INST]"},
    {CHAT_LLAMA2_SYS_STRIP,
     "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi "
     "there</s>[INST] Who are you [/INST]I am an assistant</s>[INST] Another question "
     "[/INST]"},
    {CHAT_MISTRAL_V1,
     " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you "
     "[/INST]    I am an assistant   </s> [INST] Another question [/INST]"},
    {CHAT_MISTRAL_V3,
     "[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>[INST] Who are "
     "you[/INST] I am an assistant</s>[INST] Another question[/INST]"},
    {CHAT_MISTRAL_V3_TEKKEN,
     "[INST]You are a helpful assistant\n\nHello[/INST]Hi there</s>[INST]Who are "
     "you[/INST]   I am an assistant   </s>[INST]Another question[/INST]"},
    {CHAT_MISTRAL_V7,
     "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST] Hi "
     "there</s>[INST] Who are you[/INST]    I am an assistant   </s>[INST] Another "
     "question[/INST]"},
    {CHAT_PLAIN,
     "System: You are a helpful assistant\nUser: Hello\nAssistant: Hi there\nUser: Who are "
     "you\nAssistant:    I am an assistant   \nUser: Another question\nAssistant:"},
};

static void formats_match_llama_cpp(void)
{
    char out[1024];
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        int n = chat_apply(CASES[i].f, CONV, N_CONV, true, out, sizeof out);
        CHECK_MSG(n == (int)strlen(CASES[i].expected) && strcmp(out, CASES[i].expected) == 0,
                  "%s: got (%d bytes)\n%s\n---- expected (%zu bytes)\n%s",
                  chat_family_name(CASES[i].f), n, out, strlen(CASES[i].expected),
                  CASES[i].expected);
    }
}

static void generation_prompt_is_optional(void)
{
    char out[256];
    const struct chat_message one[] = {{"user", "Hi"}};
    CHECK(chat_apply(CHAT_CHATML, one, 1, false, out, sizeof out) > 0);
    CHECK(strcmp(out, "<|im_start|>user\nHi<|im_end|>\n") == 0);
    CHECK(chat_apply(CHAT_LLAMA3, one, 1, false, out, sizeof out) > 0);
    CHECK(strcmp(out, "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>") == 0);
    CHECK(chat_apply(CHAT_PLAIN, one, 1, false, out, sizeof out) > 0);
    CHECK(strcmp(out, "User: Hi\n") == 0);
    /* the [INST] families end a user turn with the assistant's cue either way */
    CHECK(chat_apply(CHAT_LLAMA2, one, 1, false, out, sizeof out) > 0);
    CHECK(strcmp(out, "[INST] Hi [/INST]") == 0);
    CHECK_EQ(chat_apply(CHAT_CHATML, NULL, 0, true, out, sizeof out), 22);
    CHECK(strcmp(out, "<|im_start|>assistant\n") == 0);
}

static void buffer_too_small_is_truncated_and_sized(void)
{
    char full[512], small[512];
    int len = chat_apply(CHAT_CHATML, CONV, 3, true, full, sizeof full);
    CHECK(len > 0 && len < (int)sizeof full);
    CHECK_EQ(chat_apply(CHAT_CHATML, CONV, 3, true, NULL, 0), len);
    for (int cap = 1; cap <= len + 1; cap++) {
        memset(small, 'X', sizeof small);
        CHECK_EQ(chat_apply(CHAT_CHATML, CONV, 3, true, small, (size_t)cap), len);
        size_t kept = (size_t)(cap - 1 < len ? cap - 1 : len);
        CHECK_MSG(memcmp(small, full, kept) == 0 && small[kept] == '\0',
                  "cap %d: prefix or terminator wrong", cap);
        CHECK_MSG(small[cap] == 'X', "cap %d: wrote past the buffer", cap);
    }
}

static void unknown_role_and_bad_input_are_errors(void)
{
    char out[256];
    const struct chat_message tool[] = {{"user", "x"}, {"tool", "{}"}};
    for (int f = CHAT_PLAIN; f <= CHAT_MISTRAL_V7; f++)
        CHECK_MSG(chat_apply(f, tool, 2, true, out, sizeof out) == -1, "%s",
                  chat_family_name(f));
    const struct chat_message no_content[] = {{"user", NULL}};
    CHECK_EQ(chat_apply(CHAT_CHATML, no_content, 1, true, out, sizeof out), -1);
    const struct chat_message no_role[] = {{NULL, "x"}};
    CHECK_EQ(chat_apply(CHAT_CHATML, no_role, 1, true, out, sizeof out), -1);
    CHECK_EQ(chat_apply(CHAT_CHATML, CONV, -1, true, out, sizeof out), -1);
    CHECK_EQ(chat_apply((enum chat_family)99, CONV, 1, true, out, sizeof out), -1);
    CHECK_EQ(chat_apply(CHAT_CHATML, CONV, 1, true, NULL, 10), -1);
}

static void stop_texts_per_family(void)
{
    CHECK(strcmp(chat_stop_text(CHAT_CHATML), "<|im_end|>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_LLAMA3), "<|eot_id|>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_LLAMA2_SYS), "</s>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_MISTRAL_V7), "</s>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_PLAIN), "\nUser:") == 0);
}

int main(void)
{
    RUN(detects_real_templates);
    RUN(detects_family_names);
    RUN(formats_match_llama_cpp);
    RUN(generation_prompt_is_optional);
    RUN(buffer_too_small_is_truncated_and_sized);
    RUN(unknown_role_and_bad_input_are_errors);
    RUN(stop_texts_per_family);
    return test_finish();
}
