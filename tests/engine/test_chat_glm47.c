/*
 * The glm-4.7 chat family: GLM-4.7's and GLM-4.7-Flash's template without tools. The
 * expected prompts are what the real template (llama.cpp's models/templates/
 * GLM-4.7-Flash.jinja, zai-org's chat_template.jinja) renders for the same messages with
 * Jinja2 3.1 as transformers renders a chat template (a sandboxed environment with
 * trim_blocks and lstrip_blocks, add_generation_prompt and enable_thinking passed or left
 * undefined), copied here; the template's text itself is in test_deepseek_text.c.
 */
#include <string.h>

#include "engine/tok/chat.h"
#include "tests/support/test.h"

/* What marks the template: "[gMASK]<sop>" with GLM-4.5's tool calls ("<arg_key>"), but
 * not GLM-4.5's and 4.6's "/nothink" switch, nor GLM-4-0414's and GLM-Z1's templates,
 * which have no "<arg_key>". */
static void detects_glm47_by_its_markers(void)
{
    CHECK_EQ(chat_detect("[gMASK]<sop>{% for m in messages %}<arg_key>{{ k }}</arg_key>"
                         "{% endfor %}<|assistant|>{{- '</think>' if (enable_thinking is defined "
                         "and not enable_thinking) else '<think>' -}}"),
             CHAT_GLM_4_7);
    /* GLM-4.6's template (llama.cpp's models/templates/GLM-4.6.jinja): its user turn and
     * tool calls, whose line breaks glm-4.7 does not write: glm-4.5 (test_chat_glm45.c) */
    CHECK_EQ(chat_detect("[gMASK]<sop>{%- if m.role == 'user' -%}<|user|>\n"
                         "{{ visible_text(m.content) }}\n{{- '/nothink' if (enable_thinking is "
                         "defined and not enable_thinking and not visible_text(m.content)"
                         ".endswith(\"/nothink\")) else '' -}}\n<arg_key>{{ k }}</arg_key>"),
             CHAT_GLM_4_5);
    CHECK_EQ(chat_detect("[gMASK]<sop>{{ '<|assistant|>\\n<think>' }}"), CHAT_GLM_Z1);
    CHECK_EQ(chat_detect("<|im_start|><arg_key>"), CHAT_CHATML);
    CHECK_EQ(chat_detect("glm-4.7"), CHAT_GLM_4_7);
    CHECK(!strcmp(chat_family_name(CHAT_GLM_4_7), "glm-4.7"));
}

static const struct chat_message CONV[] = {
    {"system", "Be brief."},
    {"user", "Hello"},
    {"assistant", "<think>\nGreet back.\n</think>\n\nHi there!"},
    {"user", " 2+2? \n"},
    /* after the last user message: reasoning kept, stripped; the answer stripped */
    {"assistant", "<think> Add.  </think>  4  "},
    /* reasoning of white space alone: an empty block */
    {"assistant", "<think> \t </think>ok"},
    /* "</think>" without "<think>": what precedes it is the reasoning */
    {"assistant", "why</think>\n\n because "},
    /* an empty block and an empty answer */
    {"assistant", "x<think>\n\n</think>\n"},
    {"assistant", "no block "},
    {"system", "late"},
};

/* Earlier replies' reasoning dropped, "</think>" left in their place; no line break after
 * a role; the generation prompt opens the block, or closes it with enable_thinking false. */
static void renders_as_the_template(void)
{
    char out[1024];
    CHECK(chat_apply(CHAT_GLM_4_7, CONV, 4, true, out, sizeof out) > 0);
    CHECK_MSG(!strcmp(out, "[gMASK]<sop><|system|>Be brief.<|user|>Hello<|assistant|></think>Hi "
                           "there!<|user|> 2+2? \n<|assistant|><think>"),
              "%s", out);
    CHECK(chat_apply_think(CHAT_GLM_4_7, CONV, 4, true, false, out, sizeof out) > 0);
    CHECK_MSG(!strcmp(out, "[gMASK]<sop><|system|>Be brief.<|user|>Hello<|assistant|></think>Hi "
                           "there!<|user|> 2+2? \n<|assistant|></think>"),
              "%s", out);
    CHECK(chat_apply(CHAT_GLM_4_7, CONV, 4, false, out, sizeof out) > 0);
    CHECK_MSG(!strcmp(out, "[gMASK]<sop><|system|>Be brief.<|user|>Hello<|assistant|></think>Hi "
                           "there!<|user|> 2+2? \n"),
              "%s", out);

    static const char replies[] =
        "[gMASK]<sop><|system|>Be brief.<|user|>Hello<|assistant|></think>Hi there!<|user|> "
        "2+2? \n<|assistant|><think>Add.</think>4<|assistant|><think></think>ok<|assistant|>"
        "<think>why</think>because<|assistant|></think><|assistant|></think>no block<|system|>"
        "late";
    int n = (int)(sizeof CONV / sizeof CONV[0]);
    CHECK_EQ(chat_apply(CHAT_GLM_4_7, CONV, n, false, out, sizeof out), (int)strlen(replies));
    CHECK_MSG(!strcmp(out, replies), "%s", out);
    CHECK(chat_apply(CHAT_GLM_4_7, CONV, n, true, out, sizeof out) > 0);
    CHECK_MSG(!strncmp(out, replies, strlen(replies)) &&
                  !strcmp(out + strlen(replies), "<|assistant|><think>"),
              "%s", out);
    CHECK(chat_apply_think(CHAT_GLM_4_7, CONV, n, true, false, out, sizeof out) > 0);
    CHECK_MSG(!strncmp(out, replies, strlen(replies)) &&
                  !strcmp(out + strlen(replies), "<|assistant|></think>"),
              "%s", out);

    /* no user message: every reply follows the last one */
    static const struct chat_message no_user[] = {{"assistant", "<think>r</think>a"},
                                                  {"system", "s"}};
    CHECK(chat_apply(CHAT_GLM_4_7, no_user, 2, true, out, sizeof out) > 0);
    CHECK_MSG(!strcmp(out, "[gMASK]<sop><|assistant|><think>r</think>a<|system|>s<|assistant|>"
                           "<think>"),
              "%s", out);
}

/* A reply begins inside the block the prompt opened, or, with enable_thinking false,
 * after the block the prompt closed; "<|user|>" ends it (the stop text, when the file
 * does not mark the token end-of-generation). */
static void reasoning_and_stop(void)
{
    CHECK_EQ(chat_thinking(CHAT_GLM_4_7), CHAT_THINK_OPENED);
    CHECK_EQ(chat_thinking_for(CHAT_GLM_4_7, true), CHAT_THINK_OPENED);
    CHECK_EQ(chat_thinking_for(CHAT_GLM_4_7, false), CHAT_THINK_REPLY);
    /* the others' prompts open what they open whatever the switch */
    CHECK_EQ(chat_thinking_for(CHAT_GLM_Z1, false), CHAT_THINK_OPENED);
    CHECK_EQ(chat_thinking_for(CHAT_QWEN3_THINKING, false), CHAT_THINK_OPENED);
    CHECK_EQ(chat_thinking_for(CHAT_QWEN3, false), CHAT_THINK_REPLY);
    CHECK_EQ(chat_thinking_for(CHAT_CHATGLM4, true), CHAT_THINK_NONE);
    CHECK(!strcmp(chat_stop_text(CHAT_GLM_4_7), "<|user|>"));
}

int main(void)
{
    RUN(detects_glm47_by_its_markers);
    RUN(renders_as_the_template);
    RUN(reasoning_and_stop);
    return test_finish();
}
