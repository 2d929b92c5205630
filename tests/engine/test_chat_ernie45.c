/*
 * The ernie4_5 chat family: ERNIE 4.5's template (ERNIE-4.5-0.3B, 21B-A3B, 300B-A47B, the
 * -PT files'). The expected prompts are what the real template (transformers'
 * DEFAULT_CHAT_TEMPLATE in src/transformers/models/ernie4_5/tokenization_ernie4_5_fast.py,
 * which its convert_ernie4_5_tokenizer.py writes into baidu's tokenizer; below) renders for
 * the same messages with Debian's Jinja2 3.1 as transformers renders a chat template (an
 * immutable sandboxed environment with trim_blocks and lstrip_blocks, add_generation_prompt
 * passed), copied here.
 */
#include <string.h>

#include "engine/tok/chat.h"
#include "tests/support/test.h"

static const char ERNIE_4_5[] =
    "{%- if not add_generation_prompt is defined -%}\n"
    "    {%- set add_generation_prompt = true -%}\n"
    "{%- endif -%}\n"
    "{%- if not cls_token is defined -%}\n"
    "    {%- set cls_token = \"<|begin_of_sentence|>\" -%}\n"
    "{%- endif -%}\n"
    "{%- if not sep_token is defined -%}\n"
    "    {%- set sep_token = \"<|end_of_sentence|>\" -%}\n"
    "{%- endif -%}\n"
    "{{- cls_token -}}\n"
    "{%- for message in messages -%}\n"
    "    {%- if message[\"role\"] == \"user\" -%}\n"
    "        {{- \"User: \" + message[\"content\"] + \"\\n\" -}}\n"
    "    {%- elif message[\"role\"] == \"assistant\" -%}\n"
    "        {{- \"Assistant: \" + message[\"content\"] + sep_token -}}\n"
    "    {%- elif message[\"role\"] == \"system\" -%}\n"
    "        {{- message[\"content\"] + \"\\n\" -}}\n"
    "    {%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{- \"Assistant: \" -}}\n"
    "{%- endif -%}";

/* What marks the template: its cls_token and sep_token with its "User: " turns. */
static void detects_ernie45_by_its_markers(void)
{
    CHECK_EQ(chat_detect(ERNIE_4_5), CHAT_ERNIE4_5);
    CHECK_EQ(chat_detect("ernie4_5"), CHAT_ERNIE4_5);
    CHECK(!strcmp(chat_family_name(CHAT_ERNIE4_5), "ernie4_5"));
    /* the markers alone, without the turns, are not enough */
    CHECK_EQ(chat_detect("{{ '<|begin_of_sentence|>' }}{{ '<|end_of_sentence|>' }}"), CHAT_PLAIN);
    /* DeepSeek-V2's "User: " turns keep their family */
    CHECK_EQ(chat_detect("{{ 'User: ' + message['content'] }}"
                         "{{ 'Assistant: ' + message['content'] + eos_token }}"),
             CHAT_DEEPSEEK2);
}

static const struct chat_message CONV[] = {
    {"system", "Be brief."},
    {"user", "Hello"},
    {"assistant", "Hi there!"},
    {"user", " 2+2? \n"},
};

/* The cls_token first, every content as it is, a reply closed by the sep_token. */
static void renders_as_the_template(void)
{
    char out[512];
    CHECK(chat_apply(CHAT_ERNIE4_5, CONV, 4, true, out, sizeof out) > 0);
    CHECK_MSG(!strcmp(out, "<|begin_of_sentence|>Be brief.\nUser: Hello\nAssistant: Hi there!"
                           "<|end_of_sentence|>User:  2+2? \n\nAssistant: "),
              "%s", out);
    CHECK(chat_apply(CHAT_ERNIE4_5, CONV, 4, false, out, sizeof out) > 0);
    CHECK_MSG(!strcmp(out, "<|begin_of_sentence|>Be brief.\nUser: Hello\nAssistant: Hi there!"
                           "<|end_of_sentence|>User:  2+2? \n\n"),
              "%s", out);
    /* the template has no switch */
    CHECK(chat_apply_think(CHAT_ERNIE4_5, CONV, 4, true, false, out, sizeof out) > 0);
    CHECK_MSG(!strcmp(out, "<|begin_of_sentence|>Be brief.\nUser: Hello\nAssistant: Hi there!"
                           "<|end_of_sentence|>User:  2+2? \n\nAssistant: "),
              "%s", out);
    /* any order, a system message anywhere, an empty one */
    static const struct chat_message odd[] = {
        {"assistant", " a "}, {"system", "s"}, {"system", "t"}, {"user", ""}};
    CHECK(chat_apply(CHAT_ERNIE4_5, odd, 4, true, out, sizeof out) > 0);
    CHECK_MSG(!strcmp(out, "<|begin_of_sentence|>Assistant:  a <|end_of_sentence|>s\nt\nUser: \n"
                           "Assistant: "),
              "%s", out);
    /* no message: the cls_token and the generation prompt */
    CHECK(chat_apply(CHAT_ERNIE4_5, CONV, 0, true, out, sizeof out) > 0);
    CHECK_MSG(!strcmp(out, "<|begin_of_sentence|>Assistant: "), "%s", out);
}

/* A reply ends at the sep_token; it has no reasoning to tell apart. */
static void stop_and_reasoning(void)
{
    CHECK(!strcmp(chat_stop_text(CHAT_ERNIE4_5), "<|end_of_sentence|>"));
    CHECK_EQ(chat_thinking(CHAT_ERNIE4_5), CHAT_THINK_NONE);
    CHECK_EQ(chat_thinking_for(CHAT_ERNIE4_5, false), CHAT_THINK_NONE);
}

int main(void)
{
    RUN(detects_ernie45_by_its_markers);
    RUN(renders_as_the_template);
    RUN(stop_and_reasoning);
    return test_finish();
}
