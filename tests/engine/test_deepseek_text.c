/*
 * The text side of the DeepSeek-V2/V3 family (deepseek2: DeepSeek-V2, V2-Lite, V2.5, V3,
 * R1, GLM-4.7-Flash): the pre-tokenizer names "deepseek-v3" (DeepSeek-V3, R1) and
 * "joyai-llm" (JoyAI-LLM-Flash), which llama.cpp gives hunyuan-dense's regexes, and the
 * chat templates of their GGUF files. The pre-tokenizers give llama.cpp's ids on the GPT-2
 * vocabulary of the shared test data (their own vocabularies are not in it), '~' a symbol
 * as in llama.cpp since August 2026. The templates are detected as llama.cpp's
 * llm_chat_detect_template detects them: DeepSeek-V2's and V2-Lite-Chat's "User: " /
 * "Assistant: " one as deepseek2, DeepSeek-V3's as deepseek3 (R1's has the same
 * markers), GLM-4.7-Flash's as glm-4.7 (its own format, where llama.cpp's takes it for
 * chatglm4: test_chat_glm47.c); deepseek2's prompt is llama.cpp's (2026-04,
 * llama_chat_apply_template).
 */
#include <stdio.h>
#include <string.h>

#include "engine/gguf/gguf.h"
#include "engine/tok/chat.h"
#include "engine/tok/tokenizer.h"
#include "tests/support/gguf_copy.h"
#include "tests/support/test.h"

/* The GPT-2 vocabulary with tokenizer.ggml.pre set to each name: digits in threes, CJK
 * ideographs and kana in runs of their own, a letter run after one ASCII punctuation mark,
 * marks with their letters, Hangul as letters, line breaks apart; the ids are llama.cpp's
 * (2026-04, llama_tokenize with add_special and parse_special) on the same files, the same
 * for both names, but for '~' (below). */
static void test_pre_tokenizers(void)
{
    const char *src = test_data_path("vocab/ggml-vocab-gpt-2.gguf");
    if (!src) {
        SKIP("no shared test data (vocab/ggml-vocab-gpt-2.gguf)");
        return;
    }
    static const struct {
        const char *text;
        int n;
        int32_t ids[40];
    } cases[] = {
        {"服务器返回状态码和消息。サーバーはひらがな", 39,
         {17312, 235,   27950, 94,    161,   247,   101,   32573, 242,   32368,
          252,   163,   232,   35050, 222,   223,   163,   254,   223,   161,
          240,   234,   162,   114,   230,   162,   223,   107,   16764, 26503,
          12045, 238,   6312,  31676, 2515,  110,   36853, 35585, 26945}},
        {"#include <stdio.h> $HOME @user .NET", 14,
         {2, 17256, 1279, 19282, 952, 13, 71, 29, 720, 39069, 2488, 7220, 764, 12884}},
        {"café naïve e\xcc\x81 ½ € 😀😀 ++--==", 17,
         {66, 1878, 2634, 41492, 304, 136, 223, 220, 23141, 10432, 30325, 222, 47249, 222,
          19969, 438, 855}},
        {"Hello, world 1234567!", 8, {15496, 11, 995, 220, 10163, 29228, 22, 0}},
        {"한국어 텍스트와 English 혼합", 28,
         {47991, 250, 166, 113, 255, 168, 244, 112, 220, 169, 227, 235, 168, 232,
          97,    169, 232, 116, 168, 247, 222, 3594, 220, 169, 246, 120, 47991, 102}},
        {"line one\r\nline two\r\n\r", 9, {1370, 530, 201, 198, 1370, 734, 201, 198, 201}},
        /* '~' is a symbol (Unicode's Sm) that a space goes with, as in DeepSeek's own
         * tokenizer and llama.cpp since August 2026 (its pull request 26972); the April
         * build that gave the ids above left it out of \p{S} and split " ~" in two */
        {"cd ~/src && echo ~ [rio@rapidio ~]$", 15,
         {10210, 47795, 10677, 11405, 9809, 5299, 685, 27250, 31, 2416, 312, 952, 5299, 60, 3}},
    };
    static const char *const names[] = {"deepseek-v3", "joyai-llm"};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        char path[512], err[ERR_MAX];
        snprintf(path, sizeof path, "%s/%s-vocab.gguf", test_tmpdir(), names[k]);
        CHECK_MSG(gguf_copy_with_str(src, path, "tokenizer.ggml.pre", names[k], err) == 0,
                  "%s", err);
        gguf_file *g = gguf_open(path, err);
        CHECK_MSG(g, "%s", err);
        tokenizer *t = NULL;
        CHECK_MSG(tok_load(g, &t, err) == 0, "%s: %s", names[k], err);
        for (size_t c = 0; t && c < sizeof cases / sizeof *cases; c++) {
            int32_t ids[64];
            int n = tok_encode(t, cases[c].text, strlen(cases[c].text), true, true, ids, 64);
            CHECK_MSG(n == cases[c].n && !memcmp(ids, cases[c].ids, (size_t)n * sizeof *ids),
                      "%s, case %zu: %d ids", names[k], c, n);
        }
        tok_free(t);
        gguf_close(g);
    }
}

/* deepseek-ai/DeepSeek-V2-Chat's and DeepSeek-V2-Lite-Chat's tokenizer_config.json */
static const char DEEPSEEK_V2[] =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt "
    "= false %}{% endif %}{{ bos_token }}{% for message in messages %}{% if message['role']"
    " == 'user' %}{{ 'User: ' + message['content'] + '\\n\\n' }}{% elif message['role'] "
    "== 'assistant' %}{{ 'Assistant: ' + message['content'] + eos_token }}{% "
    "elif message['role'] == 'system' %}{{ message['content'] + '\\n\\n' }}{% "
    "endif %}{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif "
    "%}";

/* deepseek-ai/DeepSeek-V3's, as its GGUF files hold it */
static const char DEEPSEEK_V3[] =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt "
    "= false %}{% endif %}{% set ns = namespace(is_first=false, is_tool=false, "
    "is_output_first=true, system_prompt='', is_first_sp=true) %}{%- for message "
    "in messages %}{%- if message['role'] == 'system' %}{%- if ns.is_first_sp "
    "%}{% set ns.system_prompt = ns.system_prompt + message['content'] %}{% set "
    "ns.is_first_sp = false %}{%- else %}{% set ns.system_prompt = ns.system_prompt "
    "+ '\\n\\n' + message['content'] %}{%- endif %}{%- endif %}{%- endfor %}{{bos_token}}{{"
    "ns.system_prompt}}{%- for message in messages %}{%- if message['role'] == "
    "'user' %}{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}{%- "
    "endif %}{%- if message['role'] == 'assistant' and message['content'] is "
    "none %}{%- set ns.is_tool = false -%}{%- for tool in message['tool_calls']%}{%- "
    "if not ns.is_first %}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' "
    "+ tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' "
    "+ '\\n' + tool['function']['arguments'] + '\\n' + '```' + '<｜tool▁call▁end｜>'}}{%- "
    "set ns.is_first = true -%}{%- else %}{{'\\n' + '<｜tool▁call▁begin｜>' + tool['type'] "
    "+ '<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' + '\\n' "
    "+ tool['function']['arguments'] + '\\n' + '```' + '<｜tool▁call▁end｜>'}}{{'<｜tool▁calls"
    "▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor %}{%- endif %}{%- if "
    "message['role'] == 'assistant' and message['content'] is not none %}{%- "
    "if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}"
    "}{%- set ns.is_tool = false -%}{%- else %}{{'<｜Assistant｜>' + message['content'] "
    "+ '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}{%- if message['role'] "
    "== 'tool' %}{%- set ns.is_tool = true -%}{%- if ns.is_output_first %}{{'<｜tool▁outputs"
    "▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- "
    "set ns.is_output_first = false %}{%- else %}{{'\\n<｜tool▁output▁begin｜>' "
    "+ message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %}{%- "
    "endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}{% if "
    "add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}";

/* zai-org/GLM-4.7-Flash's chat_template.jinja */
static const char GLM_4_7_FLASH[] =
    "[gMASK]<sop>\n{%- if tools -%}\n<|system|>\n# Tools\n\nYou may call one "
    "or more functions to assist with the user query.\n\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\n<tools>\n{% for tool "
    "in tools %}\n{{ tool | tojson(ensure_ascii=False) }}\n{% endfor %}\n</tools>\n"
    "\nFor each function call, output the function name and arguments within "
    "the following XML format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><ar"
    "g_value>{arg-value-1}</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2"
    "}</arg_value>...</tool_call>{%- endif -%}\n{%- macro visible_text(content) "
    "-%}\n    {%- if content is string -%}\n        {{- content }}\n    {%- elif "
    "content is iterable and content is not mapping -%}\n        {%- for item "
    "in content -%}\n            {%- if item is mapping and item.type == 'text' "
    "-%}\n                {{- item.text }}\n            {%- elif item is string "
    "-%}\n                {{- item }}\n            {%- endif -%}\n        {%- "
    "endfor -%}\n    {%- else -%}\n        {{- content }}\n    {%- endif -%}\n"
    "{%- endmacro -%}\n{%- set ns = namespace(last_user_index=-1) %}\n{%- for "
    "m in messages %}\n    {%- if m.role == 'user' %}\n        {% set ns.last_user_index "
    "= loop.index0 -%}\n    {%- endif %}\n{%- endfor %}\n{% for m in messages "
    "%}\n{%- if m.role == 'user' -%}<|user|>{{ visible_text(m.content) }}\n{%- "
    "elif m.role == 'assistant' -%}\n<|assistant|>\n{%- set reasoning_content "
    "= '' %}\n{%- set content = visible_text(m.content) %}\n{%- if m.reasoning_content "
    "is string %}\n    {%- set reasoning_content = m.reasoning_content %}\n{%- "
    "else %}\n    {%- if '</think>' in content %}\n        {%- set reasoning_content "
    "= content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') "
    "%}\n        {%- set content = content.split('</think>')[-1].lstrip('\\n') "
    "%}\n    {%- endif %}\n{%- endif %}\n{%- if ((clear_thinking is defined and "
    "not clear_thinking) or loop.index0 > ns.last_user_index) and reasoning_content "
    "-%}\n{{ '<think>' + reasoning_content.strip() +  '</think>'}}\n{%- else "
    "-%}\n{{ '</think>' }}\n{%- endif -%}\n{%- if content.strip() -%}\n{{ content.strip() "
    "}}\n{%- endif -%}\n{% if m.tool_calls %}\n{% for tc in m.tool_calls %}\n"
    "{%- if tc.function %}\n    {%- set tc = tc.function %}\n{%- endif %}\n{{- "
    "'<tool_call>' + tc.name -}}\n{% set _args = tc.arguments if tc.arguments "
    "is defined and tc.arguments is mapping else {} %}{% for k, v in _args.items() "
    "%}<arg_key>{{ k }}</arg_key><arg_value>{{ v | tojson(ensure_ascii=False) "
    "if v is not string else v }}</arg_value>{% endfor %}</tool_call>{% endfor "
    "%}\n{% endif %}\n{%- elif m.role == 'tool' -%}\n{%- if m.content is string "
    "-%}\n{%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "    {{- '<|observation|>' }}\n{%- endif %}\n{{- '<tool_response>' }}\n{{- "
    "m.content }}\n{{- '</tool_response>' }}\n{%- else -%}\n<|observation|>{% "
    "for tr in m.content %}\n<tool_response>{{ tr.output if tr.output is defined "
    "else tr }}</tool_response>{% endfor -%}\n{% endif -%}\n{%- elif m.role == "
    "'system' -%}\n<|system|>{{ visible_text(m.content) }}\n{%- endif -%}\n{%- "
    "endfor -%}\n{%- if add_generation_prompt -%}\n    <|assistant|>{{- '</think>' "
    "if (enable_thinking is defined and not enable_thinking) else '<think>' -}}\n"
    "{%- endif -%}\n";

/* As llama.cpp (2026-04) detects them: its llama_chat_apply_template with each template
 * writes the deepseek2 and deepseek3 formats. GLM-4.7-Flash's it takes for chatglm4 by
 * its "[gMASK]<sop>", though its own template writes no line break after a role and opens
 * the reply with "<think>"; llmsd writes it as glm-4.7, as the template does. */
static void test_templates_detected(void)
{
    CHECK_EQ(chat_detect(DEEPSEEK_V2), CHAT_DEEPSEEK2);
    CHECK_EQ(chat_detect(DEEPSEEK_V3), CHAT_DEEPSEEK3);
    CHECK_EQ(chat_detect(GLM_4_7_FLASH), CHAT_GLM_4_7);
    CHECK_EQ(chat_detect("deepseek2"), CHAT_DEEPSEEK2);
    CHECK(!strcmp(chat_family_name(CHAT_DEEPSEEK2), "deepseek2"));
}

/* deepseek2's turns equal llama.cpp's output for one user message without the generation
 * prompt and for a short conversation with it; the EOS text ends a reply (the stop text);
 * no think markers. */
static void test_deepseek2_format(void)
{
    char out[256];
    const struct chat_message one[] = {{"user", "Hello"}};
    CHECK_EQ(chat_apply(CHAT_DEEPSEEK2, one, 1, false, out, sizeof out), 13);
    CHECK(!strcmp(out, "User: Hello\n\n"));
    const struct chat_message two[] = {{"system", "Be brief."}, {"user", "Hi"},
                                       {"assistant", "Hello!"}, {"user", "Bye"}};
    CHECK(chat_apply(CHAT_DEEPSEEK2, two, 4, true, out, sizeof out) > 0);
    CHECK_MSG(!strcmp(out, "Be brief.\n\nUser: Hi\n\nAssistant: Hello!<｜end▁of▁sentence｜>User: "
                           "Bye\n\nAssistant:"),
              "%s", out);
    CHECK(!strcmp(chat_stop_text(CHAT_DEEPSEEK2), "<｜end▁of▁sentence｜>"));
    CHECK_EQ(chat_thinking(CHAT_DEEPSEEK2), CHAT_THINK_NONE);
}

int main(void)
{
    RUN(test_pre_tokenizers);
    RUN(test_templates_detected);
    RUN(test_deepseek2_format);
    return test_finish();
}
