/*
 * The glm-4.5 chat family: GLM-4.5's, GLM-4.5-Air's and GLM-4.6's template without tools.
 * The expected prompts are what the real template (llama.cpp's models/templates/
 * GLM-4.6.jinja, ggml-org/llama.cpp afefa651, below; GLM-4.5's and 4.5-Air's write the
 * same turns) renders for the same messages with Debian's Jinja2 3.1 as transformers
 * renders a chat template (an immutable sandboxed environment with trim_blocks and
 * lstrip_blocks, add_generation_prompt passed, enable_thinking passed or left undefined),
 * copied here.
 */
#include <string.h>

#include "engine/tok/chat.h"
#include "tests/support/test.h"

/* llama.cpp's models/templates/GLM-4.6.jinja (zai-org/GLM-4.6's chat_template.jinja) */
static const char GLM_4_6[] =
    "[gMASK]<sop>\n"
    "{%- if tools -%}\n"
    "<|system|>\n"
    "# Tools\n"
    "\n"
    "You may call one or more functions to assist with the user query.\n"
    "\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n"
    "{% for tool in tools %}\n"
    "{{ tool | tojson(ensure_ascii=False) }}\n"
    "{% endfor %}\n"
    "</tools>\n"
    "\n"
    "For each function call, output the function name and arguments within the following XM"
    "L format:\n"
    "<tool_call>{function-name}\n"
    "<arg_key>{arg-key-1}</arg_key>\n"
    "<arg_value>{arg-value-1}</arg_value>\n"
    "<arg_key>{arg-key-2}</arg_key>\n"
    "<arg_value>{arg-value-2}</arg_value>\n"
    "...\n"
    "</tool_call>{%- endif -%}\n"
    "{%- macro visible_text(content) -%}\n"
    "    {%- if content is string -%}\n"
    "        {{- content }}\n"
    "    {%- elif content is iterable and content is not mapping -%}\n"
    "        {%- for item in content -%}\n"
    "            {%- if item is mapping and item.type == 'text' -%}\n"
    "                {{- item.text }}\n"
    "            {%- elif item is string -%}\n"
    "                {{- item }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{- content }}\n"
    "    {%- endif -%}\n"
    "{%- endmacro -%}\n"
    "{%- set ns = namespace(last_user_index=-1) %}\n"
    "{%- for m in messages %}\n"
    "    {%- if m.role == 'user' %}\n"
    "        {% set ns.last_user_index = loop.index0 -%}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{% for m in messages %}\n"
    "{%- if m.role == 'user' -%}<|user|>\n"
    "{{ visible_text(m.content) }}\n"
    "{{- '/nothink' if (enable_thinking is defined and not enable_thinking and not visible_"
    "text(m.content).endswith(\"/nothink\")) else '' -}}\n"
    "{%- elif m.role == 'assistant' -%}\n"
    "<|assistant|>\n"
    "{%- set reasoning_content = '' %}\n"
    "{%- set content = visible_text(m.content) %}\n"
    "{%- if m.reasoning_content is string %}\n"
    "    {%- set reasoning_content = m.reasoning_content %}\n"
    "{%- else %}\n"
    "    {%- if '</think>' in content %}\n"
    "        {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('"
    "<think>')[-1].lstrip('\\n') %}\n"
    "        {%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- if loop.index0 > ns.last_user_index and reasoning_content -%}\n"
    "{{ '\\n<think>' + reasoning_content.strip() +  '</think>'}}\n"
    "{%- else -%}\n"
    "{{ '\\n<think></think>' }}\n"
    "{%- endif -%}\n"
    "{%- if content.strip() -%}\n"
    "{{ '\\n' + content.strip() }}\n"
    "{%- endif -%}\n"
    "{% if m.tool_calls %}\n"
    "{% for tc in m.tool_calls %}\n"
    "{%- if tc.function %}\n"
    "    {%- set tc = tc.function %}\n"
    "{%- endif %}\n"
    "{{ '\\n<tool_call>' + tc.name }}\n"
    "{% set _args = tc.arguments or {} %}\n"
    "{% for k, v in _args.items() %}\n"
    "<arg_key>{{ k }}</arg_key>\n"
    "<arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}</arg_value>"
    "\n"
    "{% endfor %}\n"
    "</tool_call>{% endfor %}\n"
    "{% endif %}\n"
    "{%- elif m.role == 'tool' -%}\n"
    "{%- if m.content is string -%}\n"
    "{%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "    {{- '<|observation|>' }}\n"
    "{%- endif %}\n"
    "{{- '\\n<tool_response>\\n' }}\n"
    "{{- m.content }}\n"
    "{{- '\\n</tool_response>' }}\n"
    "{%- else -%}\n"
    "<|observation|>{% for tr in m.content %}\n"
    "\n"
    "<tool_response>\n"
    "{{ tr.output if tr.output is defined else tr }}\n"
    "</tool_response>{% endfor -%}\n"
    "{% endif -%}\n"
    "{%- elif m.role == 'system' -%}\n"
    "<|system|>\n"
    "{{ visible_text(m.content) }}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    <|assistant|>{{- '\\n<think></think>' if (enable_thinking is defined and not enabl"
    "e_thinking) else '' -}}\n"
    "{%- endif -%}\n";

/* What marks the template: "[gMASK]<sop>" with "/nothink"; GLM-4.7's (GLM-4.5's tool
 * calls without the switch), GLM-Z1's and GLM-4-0414's keep their families. */
static void detects_glm45_by_its_markers(void)
{
    CHECK_EQ(chat_detect(GLM_4_6), CHAT_GLM_4_5);
    CHECK_EQ(chat_detect("[gMASK]<sop>{{ visible_text(m.content) }}{{- '/nothink' }}"),
             CHAT_GLM_4_5);
    CHECK_EQ(chat_detect("[gMASK]<sop>{% for m in messages %}<arg_key>{{ k }}</arg_key>"
                         "{% endfor %}<|assistant|>"),
             CHAT_GLM_4_7);
    CHECK_EQ(chat_detect("[gMASK]<sop>{{ '<|assistant|>\\n<think>' }}"), CHAT_GLM_Z1);
    CHECK_EQ(chat_detect("[gMASK]<sop>{% for item in messages %}<|{{ item['role'] }}|>"),
             CHAT_CHATGLM4);
    /* Qwen3's switch is "/no_think", and chatml's */
    CHECK_EQ(chat_detect("<|im_start|>{{ '/nothink' }}"), CHAT_CHATML);
    CHECK_EQ(chat_detect("glm-4.5"), CHAT_GLM_4_5);
    CHECK(!strcmp(chat_family_name(CHAT_GLM_4_5), "glm-4.5"));
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
    /* an empty block and an empty answer: no line break for it */
    {"assistant", "x<think>\n\n</think>\n"},
    {"assistant", "no block "},
    {"system", "late"},
};
#define N_CONV ((int)(sizeof CONV / sizeof CONV[0]))

/* Earlier replies' reasoning dropped, an empty block in its place; a line break after
 * each role; the generation prompt leaves the block to the model, or closes an empty one
 * with enable_thinking false, which also ends every user message with "/nothink". */
static void renders_as_the_template(void)
{
    char out[1024];
    CHECK(chat_apply(CHAT_GLM_4_5, CONV, 4, true, out, sizeof out) > 0);
    CHECK_MSG(!strcmp(out, "[gMASK]<sop><|system|>\nBe brief.<|user|>\nHello<|assistant|>\n"
                           "<think></think>\nHi there!<|user|>\n 2+2? \n<|assistant|>"),
              "%s", out);
    CHECK(chat_apply_think(CHAT_GLM_4_5, CONV, 4, true, false, out, sizeof out) > 0);
    CHECK_MSG(!strcmp(out, "[gMASK]<sop><|system|>\nBe brief.<|user|>\nHello/nothink"
                           "<|assistant|>\n<think></think>\nHi there!<|user|>\n 2+2? \n/nothink"
                           "<|assistant|>\n<think></think>"),
              "%s", out);
    CHECK(chat_apply(CHAT_GLM_4_5, CONV, 4, false, out, sizeof out) > 0);
    CHECK_MSG(!strcmp(out, "[gMASK]<sop><|system|>\nBe brief.<|user|>\nHello<|assistant|>\n"
                           "<think></think>\nHi there!<|user|>\n 2+2? \n"),
              "%s", out);

    static const char replies[] =
        "[gMASK]<sop><|system|>\nBe brief.<|user|>\nHello<|assistant|>\n<think></think>\nHi "
        "there!<|user|>\n 2+2? \n<|assistant|>\n<think>Add.</think>\n4<|assistant|>\n<think>"
        "</think>\nok<|assistant|>\n<think>why</think>\nbecause<|assistant|>\n<think></think>"
        "<|assistant|>\n<think></think>\nno block<|system|>\nlate";
    CHECK_EQ(chat_apply(CHAT_GLM_4_5, CONV, N_CONV, false, out, sizeof out),
             (int)strlen(replies));
    CHECK_MSG(!strcmp(out, replies), "%s", out);
    CHECK(chat_apply(CHAT_GLM_4_5, CONV, N_CONV, true, out, sizeof out) > 0);
    CHECK_MSG(!strncmp(out, replies, strlen(replies)) &&
                  !strcmp(out + strlen(replies), "<|assistant|>"),
              "%s", out);
    static const char replies_nothink[] =
        "[gMASK]<sop><|system|>\nBe brief.<|user|>\nHello/nothink<|assistant|>\n<think></think>"
        "\nHi there!<|user|>\n 2+2? \n/nothink<|assistant|>\n<think>Add.</think>\n4"
        "<|assistant|>\n<think></think>\nok<|assistant|>\n<think>why</think>\nbecause"
        "<|assistant|>\n<think></think><|assistant|>\n<think></think>\nno block<|system|>\nlate"
        "<|assistant|>\n<think></think>";
    CHECK(chat_apply_think(CHAT_GLM_4_5, CONV, N_CONV, true, false, out, sizeof out) > 0);
    CHECK_MSG(!strcmp(out, replies_nothink), "%s", out);

    /* "/nothink" is not written twice; an empty message gets it */
    static const struct chat_message users[] = {
        {"user", "a /nothink"}, {"user", "b/nothink"}, {"user", "c/nothink "}, {"user", ""}};
    CHECK(chat_apply_think(CHAT_GLM_4_5, users, 4, true, false, out, sizeof out) > 0);
    CHECK_MSG(!strcmp(out, "[gMASK]<sop><|user|>\na /nothink<|user|>\nb/nothink<|user|>\n"
                           "c/nothink /nothink<|user|>\n/nothink<|assistant|>\n<think></think>"),
              "%s", out);

    /* no user message: every reply follows the last one */
    static const struct chat_message no_user[] = {{"assistant", "<think>r</think>a"},
                                                  {"system", "s"}};
    CHECK(chat_apply(CHAT_GLM_4_5, no_user, 2, true, out, sizeof out) > 0);
    CHECK_MSG(!strcmp(out, "[gMASK]<sop><|assistant|>\n<think>r</think>\na<|system|>\ns"
                           "<|assistant|>"),
              "%s", out);
    /* the reasoning before the first "</think>", after the last "<think>" before it; the
     * answer after the last "</think>" */
    static const struct chat_message nested[] = {
        {"user", "q"}, {"assistant", "<think>a<think>b</think>c</think>\n\nd"}};
    CHECK(chat_apply(CHAT_GLM_4_5, nested, 2, false, out, sizeof out) > 0);
    CHECK_MSG(!strcmp(out, "[gMASK]<sop><|user|>\nq<|assistant|>\n<think>b</think>\nd"), "%s",
              out);
}

/* A reply opens its block itself after the line break the template writes before it,
 * with enable_thinking false too (its answer comes after a line break); "<|user|>" ends
 * it. */
static void reasoning_and_stop(void)
{
    CHECK_EQ(chat_thinking(CHAT_GLM_4_5), CHAT_THINK_REPLY_SPACED);
    CHECK_EQ(chat_thinking_for(CHAT_GLM_4_5, true), CHAT_THINK_REPLY_SPACED);
    CHECK_EQ(chat_thinking_for(CHAT_GLM_4_5, false), CHAT_THINK_REPLY_SPACED);
    CHECK(!strcmp(chat_stop_text(CHAT_GLM_4_5), "<|user|>"));
}

int main(void)
{
    RUN(detects_glm45_by_its_markers);
    RUN(renders_as_the_template);
    RUN(reasoning_and_stop);
    return test_finish();
}
