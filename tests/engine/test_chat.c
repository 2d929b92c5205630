/* Tests of chat template detection and formatting. Expected outputs are those of
 * llama.cpp's llm_chat_apply_template() for the same conversation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/gguf/gguf.h"
#include "engine/tok/chat.h"
#include "engine/tok/tokenizer.h"
#include "tests/support/gemma_vocab.h"
#include "tests/support/test.h"

/* google/gemma-7b-it (llama.cpp's test-chat-template.cpp) */
static const char GEMMA_7B[] =
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') "
    "}}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') "
    "%}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ "
    "'<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' "
    "}}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}";

/* google/gemma-3-4b-it (its text part: the system message opens the first user turn) */
static const char GEMMA3[] =
    "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- if "
    "messages[0]['content'] is string -%}\n        {%- set first_user_prefix = "
    "messages[0]['content'] + '\n\n' -%}\n    {%- else -%}\n        {%- set "
    "first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n    {%- endif "
    "-%}\n    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set "
    "first_user_prefix = \"\" -%}\n    {%- set loop_messages = messages -%}\n{%- endif "
    "-%}\n{%- for message in loop_messages -%}\n    {%- if (message['role'] == 'assistant') "
    "-%}\n        {%- set role = \"model\" -%}\n    {%- else -%}\n        {%- set role = "
    "message['role'] -%}\n    {%- endif -%}\n    {{ '<start_of_turn>' + role + '\n' + "
    "(first_user_prefix if loop.first else \"\") }}\n    {%- if message['content'] is string "
    "-%}\n        {{ message['content'] | trim }}\n    {%- endif -%}\n    {{ "
    "'<end_of_turn>\n' }}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n    "
    "{{'<start_of_turn>model\n'}}\n{%- endif -%}\n";

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

/* TinyLlama/TinyLlama-1.1B-Chat-v1.0 (the same as HuggingFaceH4/zephyr-7b-beta) */
static const char TINYLLAMA[] =
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + "
    "message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ "
    "'<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == "
    "'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif "
    "%}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif "
    "%}\n{% endfor %}";


/* tiiuae/Falcon3-7B-Instruct */
static const char FALCON3[] =
    "{%- if tools %}\n{{- '<|system|>\\n' }}\n{%- if messages[0]['role'] == 'system' %}\n"
    "{{- messages[0]['content'] }}\n{%- set remaining_messages = messages[1:] %}\n"
    "{%- else %}\n{%- set remaining_messages = messages %}\n{%- endif %}\n"
    "{{- 'You are a Falcon assistant skilled in function calling. You are helpful, "
    "respectful, and concise.\\n\\n# Tools\\n\\nYou have access to the following functions. "
    "You MUST use them to answer questions when needed. For each function call, you MUST "
    "return a JSON object inside <tool_call></tool_call> tags.\\n\\n<tools>' + "
    "tools|tojson(indent=2) + '</tools>\\n\\n# Output Format\\n\\nYour response MUST follow "
    "this format when making function calls:\\n<tool_call>\\n[\\n  {\"name\": "
    "\"function_name\", \"arguments\": {\"arg1\": \"value1\", \"arg2\": \"value2\"}},\\n  "
    "{\"name\": \"another_function\", \"arguments\": {\"arg\": \"value\"}}\\n]\\n"
    "</tool_call>\\nIf no function calls are needed, respond normally without the tool_call "
    "tags.\\n' }}\n{%- for message in remaining_messages %}\n"
    "{%- if message['role'] == 'user' %}\n{{- '<|user|>\\n' + message['content'] + '\\n' }}\n"
    "{%- elif message['role'] == 'assistant' %}\n{%- if message.content %}\n"
    "{{- '<|assistant|>\\n' + message['content'] }}\n{%- endif %}\n"
    "{%- if message.tool_calls %}\n{{- '\\n<tool_call>\\n' }}\n"
    "{{- message.tool_calls|tojson(indent=2) }}\n{{- '\\n</tool_call>' }}\n{%- endif %}\n"
    "{{- eos_token + '\\n' }}\n{%- elif message['role'] == 'tool' %}\n"
    "{{- '<|assistant|>\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>\\n' "
    "}}\n{%- endif %}\n{%- endfor %}\n{{- '<|assistant|>\\n' if add_generation_prompt }}\n"
    "{%- else %}\n{%- for message in messages %}\n{%- if message['role'] == 'system' %}\n"
    "{{- '<|system|>\\n' + message['content'] + '\\n' }}\n"
    "{%- elif message['role'] == 'user' %}\n{{- '<|user|>\\n' + message['content'] + '\\n' }}\n"
    "{%- elif message['role'] == 'assistant' %}\n{%- if not loop.last %}\n"
    "{{- '<|assistant|>\\n' + message['content'] + eos_token + '\\n' }}\n{%- else %}\n"
    "{{- '<|assistant|>\\n' + message['content'] + eos_token }}\n{%- endif %}\n{%- endif %}\n"
    "{%- if loop.last and add_generation_prompt %}\n{{- '<|assistant|>\\n' }}\n{%- endif %}\n"
    "{%- endfor %}\n{%- endif %}";


/* deepseek-ai/DeepSeek-R1-Distill-Qwen-32B (the Llama distills have the same) */
static const char R1_DISTILL[] =
    "{% if not add_generation_prompt is defined -%}\n"
    "  {%- set add_generation_prompt = false -%}\n{%- endif -%}\n"
    "{%- set ns = namespace(is_first=false, is_tool=false, is_output_first=true, "
    "system_prompt='') -%}\n{%- for message in messages -%}\n"
    "  {%- if message['role'] == 'system' -%}\n"
    "    {%- set ns.system_prompt = message['content'] -%}\n  {%- endif -%}\n"
    "{%- endfor -%}{{bos_token}}{{ns.system_prompt}}\n{%- for message in messages -%}\n"
    "  {%- if message['role'] == 'user' -%}\n"
    "    {%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}\n"
    "  {%- endif -%}\n  {%- if message['role'] == 'assistant' and message['tool_calls'] -%}\n"
    "    {%- set ns.is_tool = false -%}\n    {%- for tool in message['tool_calls']-%}\n"
    "      {%- if not ns.is_first -%}\n"
    "        {{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + "
    "'<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' + '\\n' + "
    "tool['function']['arguments'] + '\\n' + '```' + '<｜tool▁call▁end｜>'}}\n"
    "        {%- set ns.is_first = true -%}\n      {%- else -%}\n"
    "        {{'\\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + "
    "tool['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments'] + "
    "'\\n' + '```' + '<｜tool▁call▁end｜>'}}\n      {%- endif -%}\n    {%- endfor -%}\n"
    "    {{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}\n  {%- endif -%}\n"
    "  {%- if message['role'] == 'assistant' and message['content'] is not none -%}\n"
    "    {%- if ns.is_tool -%}{{'<｜tool▁outputs▁end｜>' + message['content'] + "
    "'<｜end▁of▁sentence｜>'}}\n      {%- set ns.is_tool = false -%}\n    {%- else -%}\n"
    "      {%- set content = message['content'] -%}\n"
    "      {%- if '</think>' in content -%}\n"
    "        {%- set content = content.split('</think>')[-1] -%}\n"
    "      {%- endif -%}{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}\n"
    "    {%- endif -%}\n  {%- endif -%}\n  {%- if message['role'] == 'tool' -%}\n"
    "    {%- set ns.is_tool = true -%}\n    {%- if ns.is_output_first -%}"
    "{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + "
    "'<｜tool▁output▁end｜>'}}\n      {%- set ns.is_output_first = false -%}\n"
    "      {%- else -%}{{'\\n<｜tool▁output▁begin｜>' + message['content'] + "
    "'<｜tool▁output▁end｜>'}}\n    {%- endif -%}\n  {%- endif -%}\n{%- endfor -%}\n"
    "{%- if ns.is_tool -%}{{'<｜tool▁outputs▁end｜>'}}\n{%- endif -%}\n"
    "{%- if add_generation_prompt and not ns.is_tool -%}{{'<｜Assistant｜><think>\\n'}}\n"
    "{%- endif %}";


/* openchat/openchat-3.5-0106 */
static const char OPENCHAT[] =
    "{{ bos_token }}{% for message in messages %}{{ 'GPT4 Correct ' + "
    "message['role'].title() + ': ' + message['content'] + '<|end_of_turn|>'}}{% endfor "
    "%}{% if add_generation_prompt %}{{ 'GPT4 Correct Assistant:' }}{% endif %}";

/* deepseek-ai/deepseek-coder-33b-instruct */
static const char DEEPSEEK_CODER[] =
    "{% if not add_generation_prompt is defined %}\n{% set add_generation_prompt = false "
    "%}\n{% endif %}\n{%- set ns = namespace(found=false) -%}\n{%- for message in messages "
    "-%}\n    {%- if message['role'] == 'system' -%}\n        {%- set ns.found = true "
    "-%}\n    {%- endif -%}\n{%- endfor -%}\n{{bos_token}}{%- if not ns.found -%}\n{{'You "
    "are an AI programming assistant, utilizing the Deepseek Coder model, developed by "
    "Deepseek Company, and you only answer questions related to computer science. For "
    "politically sensitive questions, security and privacy issues, and other non-computer "
    "science questions, you will refuse to answer\\n'}}\n{%- endif %}\n{%- for message in "
    "messages %}\n    {%- if message['role'] == 'system' %}\n{{ message['content'] }}\n    "
    "{%- else %}\n        {%- if message['role'] == 'user' %}\n{{'### Instruction:\\n' + "
    "message['content'] + '\\n'}}\n        {%- else %}\n{{'### Response:\\n' + "
    "message['content'] + '\\n<|EOT|>\\n'}}\n        {%- endif %}\n    {%- endif "
    "%}\n{%- endfor %}\n{% if add_generation_prompt %}\n{{'### Response:'}}\n{% endif %}";

/* eachadea/vicuna-13b-1.1 (the file has none; the template users set for it) */
static const char VICUNA[] =
    "{%- for message in messages %}{%- if message['role'] == 'system' -%}{{- '' + "
    "message['content'] + '\n\n' -}}{%- else -%}{%- if message['role'] == 'user' "
    "-%}{{-'USER: ' + message['content'] + '\n'-}}{%- else -%}{{-'ASSISTANT: ' + "
    "message['content'] + '</s>\n' -}}{%- endif -%}{%- endif -%}{%- endfor -%}{%- if "
    "add_generation_prompt -%}{{-'ASSISTANT:'-}}{%- endif -%}";

/* Orca-Vicuna (likewise) */
static const char VICUNA_ORCA[] =
    "{%- for message in messages %}{%- if message['role'] == 'system' -%}{{-'SYSTEM: ' + "
    "message['content'] + '\n' -}}{%- else -%}{%- if message['role'] == 'user' "
    "-%}{{-'USER: ' + message['content'] + '\n'-}}{%- else -%}{{-'ASSISTANT: ' + "
    "message['content'] + '</s>\n' -}}{%- endif -%}{%- endif -%}{%- endfor -%}{%- if "
    "add_generation_prompt -%}{{-'ASSISTANT:'-}}{%- endif -%}";

/* mlabonne/AlphaMonarch-7B */
static const char MONARCH[] =
    "{% for message in messages %}{{bos_token + message['role'] + '\\n' + "
    "message['content'] + eos_token + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "bos_token + 'assistant\\n' }}{% endif %}";

/* Infinigence/Megrez-3B-Instruct */
static const char MEGREZ[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' "
    "%}{{ '<|role_start|>system<|role_end|>你是Megrez-3B-Instruct，将针对用户的问题给出详细"
    "的、积极的回答。<|turn_end|>' }}{% endif %}{{ '<|role_start|>' + message['role'] + "
    "'<|role_end|>' + message['content'] + '<|turn_end|>' }}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|role_start|>assistant<|role_end|>' }}{% endif %}";

/* NousResearch/Hermes-2-Pro-Llama-3-8B's (and Hermes-3-Llama-3.1-8B's) tool_use
 * template: its start (the rest lists the tools and writes chatml turns) */
static const char HERMES_TOOL_USE[] =
    "{%- macro json_to_python_type(json_spec) %}\n"
    "{%- set basic_type_map = {\n"
    "    \"string\": \"str\",\n"
    "    \"number\": \"float\",\n"
    "    \"integer\": \"int\",\n"
    "    \"boolean\": \"bool\"\n"
    "} %}\n"
    "...\n"
    "{%- endmacro %}\n"
    "\n"
    "\n"
    "{{- bos_token }}\n"
    "{{- '<|im_start|>system\n"
    "' }}\n"
    "{{- \"You are a function calling AI model. You are provided with function signatures "
    "within <tools></tools> XML tags. You may call one or more functions to assist with the "
    "user query. Don't make assumptions about what values to plug into functions. Here are "
    "the available tools: <tools> \" }}\n";

/* A chatml template as those models' default one (no tools) */
static const char CHATML_DEFAULT[] =
    "{{bos_token}}{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt "
    "%}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* Qwen/Qwen3-8B (the hybrid thinking models): its history and generation prompt */
static const char QWEN3[] =
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {%- set content = message.content %}\n"
    "        {%- set reasoning_content = '' %}\n"
    "        {%- if message.reasoning_content is defined and message.reasoning_content is not "
    "none %}\n"
    "            {%- set reasoning_content = message.reasoning_content %}\n"
    "        {%- else %}\n"
    "            {%- if '</think>' in message.content %}\n"
    "                {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}\n"
    "                {%- set reasoning_content = message.content.split('</think>')[0]"
    ".rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}\n"
    "            {%- endif %}\n"
    "        {%- endif %}\n"
    "        {%- if loop.index0 > ns.last_query_index %}\n"
    "            {%- if loop.last or (not loop.last and reasoning_content) %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + "
    "reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}\n"
    "            {%- else %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "            {%- endif %}\n"
    "        {%- else %}\n"
    "            {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "        {%- endif %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}";

/* Qwen/QwQ-32B: the generation prompt opens the block (Qwen3-*-Thinking-2507 as well) */
static const char QWQ[] =
    "{%- elif message.role == \"assistant\" and not message.tool_calls %}\n"
    "        {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n<think>\\n' }}\n"
    "{%- endif %}\n";

/* microsoft/Phi-3-mini-4k-instruct (and Phi-3.5-mini's, the same markers) */
static const char PHI3[] =
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + "
    "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + "
    "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}";

/* microsoft/Phi-4-mini-instruct: Phi-3's markers, no line breaks, a tools turn */
static const char PHI4_MINI[] =
    "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message "
    "and message['tools'] is not none %}{{ '<|' + message['role'] + '|>' + "
    "message['content'] + '<|tool|>' + message['tools'] + '<|/tool|>' + '<|end|>' }}{% else "
    "%}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% endif %}{% "
    "endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}"
    "{% endif %}";

/* microsoft/phi-4 */
static const char PHI4[] =
    "{% for message in messages %}{% if (message['role'] == 'system') %}"
    "{{'<|im_start|>system<|im_sep|>' + message['content'] + '<|im_end|>'}}{% elif "
    "(message['role'] == 'user') %}{{'<|im_start|>user<|im_sep|>' + message['content'] + "
    "'<|im_end|>'}}{% elif (message['role'] == 'assistant') %}{{'<|im_start|>assistant"
    "<|im_sep|>' + message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}";

/* ibm-granite/granite-3.1-2b-instruct, its message loop */
static const char GRANITE[] =
    "{%- for message in loop_messages %}\n    {{- '<|start_of_role|>' + message['role'] + "
    "'<|end_of_role|>' + message['content'] + '<|end_of_text|>\n' }}\n    {%- if "
    "loop.last and add_generation_prompt %}\n        {{- '<|start_of_role|>assistant' }}\n"
    "            {%- if controls %}\n                {{- ' ' + controls | tojson()}}\n"
    "            {%- endif %}\n        {{- '<|end_of_role|>' }}\n    {%- endif %}\n"
    "{%- endfor %}";

/* Phi-3, Phi-4-mini, Phi-4 and Granite 3, whose models llmsd runs: by name, so that this
 * test also runs against a chat.c without them. */
static void detects_phi_and_granite(void)
{
    static const struct {
        const char *tmpl, *family;
    } D[] = {
        {PHI3, "phi3"},
        {PHI4_MINI, "phi3"},
        {"{{'<|user|>' + '\\n' + message['content'] + '<|end|>' + '\\n' + '<|assistant|>'}}",
         "phi3"},
        {PHI4, "phi4"},
        {GRANITE, "granite"},
    };
    for (size_t i = 0; i < sizeof D / sizeof D[0]; i++) {
        const char *got = chat_family_name(chat_detect(D[i].tmpl));
        CHECK_MSG(strcmp(got, D[i].family) == 0, "%zu: expected %s, detected %s", i,
                  D[i].family, got);
    }
}

static void detects_real_templates(void)
{
    CHECK_EQ(chat_detect(QWEN2), CHAT_CHATML);
    CHECK_EQ(chat_detect(CHATML_DEFAULT), CHAT_CHATML);
    CHECK_EQ(chat_detect(HERMES_TOOL_USE), CHAT_HERMES);
    CHECK_EQ(chat_detect(LLAMA3), CHAT_LLAMA3);
    CHECK_EQ(chat_detect(LLAMA2_CHAT), CHAT_LLAMA2_SYS_STRIP);
    CHECK_EQ(chat_detect(MISTRAL_OLD), CHAT_LLAMA2);
    CHECK_EQ(chat_detect(FUSIONNET), CHAT_LLAMA2_SYS_BOS);
    CHECK_EQ(chat_detect("[INST] <<SYS>>\\n{{ system }}\\n<</SYS>>"), CHAT_LLAMA2_SYS);
    CHECK_EQ(chat_detect(MISTRAL_V1), CHAT_MISTRAL_V1);
    CHECK_EQ(chat_detect(MISTRAL_V3), CHAT_MISTRAL_V3);
    CHECK_EQ(chat_detect(MISTRAL_V3_TEKKEN), CHAT_MISTRAL_V3_TEKKEN);
    CHECK_EQ(chat_detect(MISTRAL_V7), CHAT_MISTRAL_V7);
    CHECK_EQ(chat_detect(""), CHAT_PLAIN);
    CHECK_EQ(chat_detect(NULL), CHAT_PLAIN);
}

/* Families of llama, qwen2 and qwen3 models that fell to plain before they were known;
 * by name, so that this test also runs against a chat.c without them. */
static void detects_more_llama_and_qwen_families(void)
{
    static const struct {
        const char *tmpl, *family;
    } D[] = {
        {TINYLLAMA, "zephyr"},           {FALCON3, "falcon3"},
        {R1_DISTILL, "deepseek3"},       {OPENCHAT, "openchat"},
        {DEEPSEEK_CODER, "deepseek"},    {VICUNA, "vicuna"},
        {VICUNA_ORCA, "vicuna-orca"},    {MONARCH, "monarch"},
        {MEGREZ, "megrez"},
        /* Gemma, Gemma 2 (the test vocabulary's copy of its template), Gemma 3 */
        {GEMMA_7B, "gemma"},             {GEMMA_VOCAB_TEMPLATE, "gemma"},
        {GEMMA3, "gemma"},
        /* chatml with the think markers */
        {QWEN3, "qwen3"},                {QWQ, "qwen3-thinking"},
        /* "<|user|>" templates of other architectures stay plain: GLM-Edge's
         * (THUDM/glm-edge-1.5b-chat), StableLM zephyr's "<|endoftext|>" written as text */
        {"{% for item in messages %}{% if item['role'] == 'system' %}<|system|>\n{{ "
         "item['content'] }}{% elif item['role'] == 'user' %}<|user|>\n{{ item['content'] "
         "}}{% elif item['role'] == 'assistant' %}<|assistant|>\n{{ item['content'] }}{% "
         "endif %}{% endfor %}<|assistant|>",
         "plain"},
        {"{{ '<|user|>\n' + message['content'] + '<|endoftext|>' + '\n' }}{% elif %}"
         "<|assistant|>",
         "plain"},
        /* allenai/OLMo-2-1124-7B-Instruct's (Tulu's): Falcon 3's template with a BOS */
        {"{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}{{ "
         "'<|system|>\n' + message['content'] + '\n' }}{% elif message['role'] == 'user' %}{{ "
         "'<|user|>\n' + message['content'] + '\n' }}{% elif message['role'] == 'assistant' "
         "%}{% if not loop.last %}{{ '<|assistant|>\n'  + message['content'] + eos_token + "
         "'\n' }}{% else %}{{ '<|assistant|>\n'  + message['content'] + eos_token }}{% endif "
         "%}{% endif %}{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\n' }}{% "
         "endif %}{% endfor %}",
         "falcon3"},
        /* LGAI-EXAONE/EXAONE-3.5-2.4B-Instruct */
        {"{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
         "{{ '[|system|][|endofturn|]\n' }}{% endif %}{{ '[|' + message['role'] + '|]' + "
         "message['content'] }}{% if message['role'] == 'user' %}{{ '\n' }}{% else %}{{ "
         "'[|endofturn|]\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ "
         "'[|assistant|]' }}{% endif %}",
         "exaone3"},
        /* HuggingFaceTB/SmolLM3-3B's, its lines that name the mode (chatml with the think
         * markers otherwise: qwen3's) */
        {"{%- if enable_thinking -%}\n{%- set reasoning_mode = \"/think\" -%}\n{%- else -%}\n"
         "{%- set reasoning_mode = \"/no_think\" -%}\n{%- endif -%}\n"
         "{{- \"<|im_start|>system\\n\" -}}\n"
         "{{- \"Reasoning Mode: \" + reasoning_mode + \"\\n\\n\" -}}\n"
         "{{ \"<|im_start|>assistant\\n\" + \"<think>\\n\\n</think>\\n\" + "
         "content.lstrip(\"\\n\") + \"<|im_end|>\\n\" }}",
         "smollm3"},
        /* CohereForAI/c4ai-command-r-v01's default template, its turns (Aya 23's and Aya
         * Expanse's write theirs alike) */
        {"{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set loop_messages = "
         "messages[1:] %}{% set system_message = messages[0]['content'] %}{% elif false == "
         "true %}{% set loop_messages = messages %}{% set system_message = 'You are Command-R, "
         "a brilliant, sophisticated, AI-assistant trained to assist human users by providing "
         "thorough responses. You are trained by Cohere.' %}{% else %}{% set loop_messages = "
         "messages %}{% set system_message = false %}{% endif %}{% if system_message != false "
         "%}{{ '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>' + system_message + "
         "'<|END_OF_TURN_TOKEN|>' }}{% endif %}{% for message in loop_messages %}{% set "
         "content = message['content'] %}{% if message['role'] == 'user' %}{{ "
         "'<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + content.strip() + '<|END_OF_TURN_TOKEN|>' "
         "}}{% elif message['role'] == 'assistant' %}{{ "
         "'<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' + content.strip() + "
         "'<|END_OF_TURN_TOKEN|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ "
         "'<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{% endif %}",
         "command-r"},
        /* Seed-OSS's turns (its template adds a thinking budget's system text) */
        {"{%- for message in messages %}{{ '<seed:bos>' + message.role + '\\n' + "
         "message.content + '<seed:eos>' }}{%- endfor %}{%- if add_generation_prompt %}{{ "
         "'<seed:bos>assistant\\n' }}{%- endif %}",
         "seed_oss"},
        /* Hunyuan's markers as llama.cpp detects them, and HunyuanOCR's, which is not */
        {"{{ system }}<｜hy_place▁holder▁no▁3｜>{% for m in messages %}{% if m.role == 'user' "
         "%}<｜hy_User｜>{{ m.content }}<｜hy_Assistant｜>{% endif %}{% endfor %}",
         "hunyuan-dense"},
        {"<｜hy_begin▁of▁sentence｜>{{ system }}<｜hy_place▁holder▁no▁3｜><｜hy_Assistant｜>",
         "plain"},
        /* THUDM/chatglm3-6b's prompt opening, as llama.cpp detects it */
        {"{% for message in messages %}{% if loop.first %}[gMASK]sop<|{{ message['role'] "
         "}}|>\\n {{ message['content'] }}{% else %}<|{{ message['role'] }}|>\\n {{ "
         "message['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt "
         "%}<|assistant|>{% endif %}",
         "chatglm3"},
    };
    for (size_t i = 0; i < sizeof D / sizeof D[0]; i++) {
        const char *got = chat_family_name(chat_detect(D[i].tmpl));
        CHECK_MSG(strcmp(got, D[i].family) == 0, "expected %s, detected %s", D[i].family, got);
    }
}

/* Writes a GGUF holding tokenizer.chat_template (unless NULL) and its tool_use variant
 * (unless NULL), as llama.cpp's converter stores a model's named templates, and detects
 * its family: its name, or NULL when the file could not be made. */
static const char *file_family(const char *tmpl, const char *tool_use)
{
    char path[1024], err[ERR_MAX];
    snprintf(path, sizeof path, "%s/chat-templates.gguf", test_tmpdir());
    gguf_writer *w = gguf_writer_new();
    bool ok = w && gguf_writer_set_str(w, "general.architecture", "llama") == 0 &&
              (!tmpl || gguf_writer_set_str(w, "tokenizer.chat_template", tmpl) == 0) &&
              (!tool_use ||
               gguf_writer_set_str(w, "tokenizer.chat_template.tool_use", tool_use) == 0) &&
              gguf_writer_write(w, path, err) == 0;
    gguf_writer_free(w);
    gguf_file *g = ok ? gguf_open(path, err) : NULL;
    const char *name = g ? chat_family_name(chat_detect_file(g)) : NULL;
    gguf_close(g);
    return name;
}

/* Hermes' GGUF files hold chatml as their template and the tool_use one beside it. */
static void detects_hermes_by_its_tool_use_template(void)
{
    static const struct {
        const char *tmpl, *tool_use, *family;
    } F[] = {
        {CHATML_DEFAULT, HERMES_TOOL_USE, "hermes"},
        {NULL, HERMES_TOOL_USE, "hermes"},
        {HERMES_TOOL_USE, NULL, "hermes"},
        {CHATML_DEFAULT, NULL, "chatml"},
        /* a tool_use template beside another family's, or not Hermes', changes nothing */
        {LLAMA3, HERMES_TOOL_USE, "llama3"},
        {CHATML_DEFAULT, QWEN2, "chatml"},
        {NULL, NULL, "plain"},
    };
    for (size_t i = 0; i < sizeof F / sizeof F[0]; i++) {
        const char *got = file_family(F[i].tmpl, F[i].tool_use);
        CHECK_MSG(got && !strcmp(got, F[i].family), "%zu: expected %s, detected %s", i,
                  F[i].family, got ? got : "(no file)");
    }
}

static void detects_family_names(void)
{
    for (int f = CHAT_PLAIN; f < CHAT_N_FAMILIES; f++)
        CHECK_MSG((int)chat_detect(chat_family_name(f)) == f, "name %s", chat_family_name(f));
    CHECK(strcmp(chat_family_name(CHAT_LLAMA2_SYS), "llama2-sys") == 0);
    CHECK(strcmp(chat_family_name((enum chat_family)99), "unknown") == 0);
    /* the list a setting offers is every name, in order */
    char names[512] = "";
    for (int f = CHAT_PLAIN; f < CHAT_N_FAMILIES; f++) {
        if (f)
            strcat(names, "|");
        strcat(names, chat_family_name(f));
    }
    CHECK_MSG(strcmp(names, CHAT_FAMILY_NAMES) == 0, "%s\n%s", names, CHAT_FAMILY_NAMES);
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
    /* Hermes' default template is chatml */
    {CHAT_HERMES,
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
    /* llama.cpp's LLM_CHAT_TEMPLATE_MISTRAL_V7_TEKKEN (its llama_chat_apply_template's
     * output) */
    {CHAT_MISTRAL_V7_TEKKEN,
     "[SYSTEM_PROMPT]You are a helpful assistant[/SYSTEM_PROMPT][INST]Hello[/INST]Hi "
     "there</s>[INST]Who are you[/INST]   I am an assistant   </s>[INST]Another "
     "question[/INST]"},
    /* Qwen3's template: the same for a conversation without reasoning */
    {CHAT_QWEN3,
     "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|"
     "im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are "
     "you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|"
     ">user\nAnother question<|im_end|>\n<|im_start|>assistant\n"},
    /* llama.cpp's "zephyr" with "</s>" for its "<|endoftext|>" (chat.h) */
    {CHAT_ZEPHYR,
     "<|system|>\nYou are a helpful assistant</s>\n<|user|>\nHello</s>\n"
     "<|assistant|>\nHi there</s>\n<|user|>\nWho are you</s>\n<|assistant|>\n"
     "   I am an assistant   </s>\n<|user|>\nAnother question</s>\n<|assistant|>\n"},
    {CHAT_FALCON3,
     "<|system|>\nYou are a helpful assistant\n<|user|>\nHello\n<|assistant|>\n"
     "Hi there\n<|user|>\nWho are you\n<|assistant|>\n   I am an assistant   \n"
     "<|user|>\nAnother question\n<|assistant|>\n"},
    {CHAT_DEEPSEEK3,
     "You are a helpful assistant\n\n"
     "<｜User｜>Hello<｜Assistant｜>Hi there<｜end▁of▁sentence｜><｜User｜>Who are "
     "you<｜Assistant｜>   I am an assistant   <｜end▁of▁sentence｜><｜User｜>Another "
     "question<｜Assistant｜>"},
    {CHAT_OPENCHAT,
     "You are a helpful assistant<|end_of_turn|>GPT4 Correct User: "
     "Hello<|end_of_turn|>GPT4 Correct Assistant: Hi there<|end_of_turn|>GPT4 "
     "Correct User: Who are you<|end_of_turn|>GPT4 Correct Assistant:    I am an "
     "assistant   <|end_of_turn|>GPT4 Correct User: Another "
     "question<|end_of_turn|>GPT4 Correct Assistant:"},
    {CHAT_VICUNA,
     "You are a helpful assistant\n\nUSER: Hello\nASSISTANT: Hi there</s>\n"
     "USER: Who are you\nASSISTANT:    I am an assistant   </s>\n"
     "USER: Another question\nASSISTANT:"},
    {CHAT_VICUNA_ORCA,
     "SYSTEM: You are a helpful assistant\nUSER: Hello\nASSISTANT: Hi there</s>\n"
     "USER: Who are you\nASSISTANT:    I am an assistant   </s>\n"
     "USER: Another question\nASSISTANT:"},
    {CHAT_DEEPSEEK,
     "You are a helpful assistant### Instruction:\nHello\n### Response:\nHi there\n"
     "<|EOT|>\n### Instruction:\nWho are you\n### Response:\n"
     "   I am an assistant   \n<|EOT|>\n### Instruction:\nAnother question\n"
     "### Response:\n"},
    {CHAT_MONARCH,
     "system\nYou are a helpful assistant</s>\n<s>user\nHello</s>\n<s>assistant\n"
     "Hi there</s>\n<s>user\nWho are you</s>\n<s>assistant\n"
     "   I am an assistant   </s>\n<s>user\nAnother question</s>\n<s>assistant\n"},
    {CHAT_MEGREZ,
     "<|role_start|>system<|role_end|>You are a helpful "
     "assistant<|turn_end|><|role_start|>user<|role_end|>Hello<|turn_end|>"
     "<|role_start|>assistant<|role_end|>Hi there<|turn_end|><|role_start|>user<|role_end|>Who "
     "are you<|turn_end|><|role_start|>assistant<|role_end|>   I am an assistant   "
     "<|turn_end|><|role_start|>user<|role_end|>Another "
     "question<|turn_end|><|role_start|>assistant<|role_end|>"},
    {CHAT_PHI3,
     "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n"
     "<|assistant|>\nHi there<|end|>\n<|user|>\nWho are you<|end|>\n<|assistant|>\n"
     "   I am an assistant   <|end|>\n<|user|>\nAnother question<|end|>\n<|assistant|>\n"},
    {CHAT_PHI4,
     "<|im_start|>system<|im_sep|>You are a helpful assistant<|im_end|><|im_start|>user"
     "<|im_sep|>Hello<|im_end|><|im_start|>assistant<|im_sep|>Hi there<|im_end|>"
     "<|im_start|>user<|im_sep|>Who are you<|im_end|><|im_start|>assistant<|im_sep|>"
     "   I am an assistant   <|im_end|><|im_start|>user<|im_sep|>Another question"
     "<|im_end|><|im_start|>assistant<|im_sep|>"},
    /* llama.cpp's granite ends the generation prompt with a line break, which Granite's
     * template does not write (chat.h) */
    {CHAT_GRANITE,
     "<|start_of_role|>system<|end_of_role|>You are a helpful assistant<|end_of_text|>\n"
     "<|start_of_role|>user<|end_of_role|>Hello<|end_of_text|>\n"
     "<|start_of_role|>assistant<|end_of_role|>Hi there<|end_of_text|>\n"
     "<|start_of_role|>user<|end_of_role|>Who are you<|end_of_text|>\n"
     "<|start_of_role|>assistant<|end_of_role|>   I am an assistant   <|end_of_text|>\n"
     "<|start_of_role|>user<|end_of_role|>Another question<|end_of_text|>\n"
     "<|start_of_role|>assistant<|end_of_role|>"},
    /* llama.cpp's test-chat-template.cpp, google/gemma-7b-it */
    {CHAT_GEMMA,
     "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_turn>"
     "model\nHi there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n"
     "<start_of_turn>model\nI am an assistant<end_of_turn>\n<start_of_turn>user\nAnother "
     "question<end_of_turn>\n<start_of_turn>model\n"},
    {CHAT_PLAIN,
     "System: You are a helpful assistant\nUser: Hello\nAssistant: Hi there\nUser: Who are "
     "you\nAssistant:    I am an assistant   \nUser: Another question\nAssistant:"},
    /* llama.cpp's test-chat-template.cpp, THUDM/glm-4-9b-chat */
    {CHAT_CHATGLM4,
     "[gMASK]<sop><|system|>\nYou are a helpful assistant<|user|>\nHello<|assistant|>\nHi "
     "there<|user|>\nWho are you<|assistant|>\n   I am an assistant   <|user|>\nAnother "
     "question<|assistant|>\n"},
    /* llama.cpp's LLM_CHAT_TEMPLATE_EXAONE_3: every content trimmed */
    {CHAT_EXAONE3,
     "[|system|]You are a helpful assistant[|endofturn|]\n[|user|]Hello\n"
     "[|assistant|]Hi there[|endofturn|]\n[|user|]Who are you\n"
     "[|assistant|]I am an assistant[|endofturn|]\n[|user|]Another question\n[|assistant|]"},
    /* llama.cpp's LLM_CHAT_TEMPLATE_COMMAND_R (its llama_chat_apply_template's output for
     * these messages): every content trimmed */
    {CHAT_COMMAND_R,
     "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a helpful assistant<|END_OF_TURN_TOKEN|>"
     "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hello<|END_OF_TURN_TOKEN|>"
     "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>"
     "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Who are you<|END_OF_TURN_TOKEN|>"
     "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>I am an assistant<|END_OF_TURN_TOKEN|>"
     "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Another question<|END_OF_TURN_TOKEN|>"
     "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"},
    /* llama.cpp's LLM_CHAT_TEMPLATE_SEED_OSS (its llama_chat_apply_template's output for
     * these messages): the assistant's contents trimmed */
    {CHAT_SEED_OSS,
     "<seed:bos>system\nYou are a helpful assistant<seed:eos><seed:bos>user\nHello<seed:eos>"
     "<seed:bos>assistant\nHi there<seed:eos><seed:bos>user\nWho are you<seed:eos>"
     "<seed:bos>assistant\nI am an assistant<seed:eos><seed:bos>user\nAnother "
     "question<seed:eos><seed:bos>assistant\n"},
    /* llama.cpp's LLM_CHAT_TEMPLATE_HUNYUAN_DENSE (its llama_chat_apply_template's output
     * for these messages) */
    {CHAT_HUNYUAN_DENSE,
     "You are a helpful assistant<｜hy_place▁holder▁no▁3｜><｜hy_User｜>Hello<｜hy_Assistant｜>"
     "<｜hy_Assistant｜>Hi there<｜hy_place▁holder▁no▁2｜><｜hy_User｜>Who are "
     "you<｜hy_Assistant｜><｜hy_Assistant｜>   I am an assistant   "
     "<｜hy_place▁holder▁no▁2｜><｜hy_User｜>Another question<｜hy_Assistant｜>"},
    /* llama.cpp's LLM_CHAT_TEMPLATE_CHATGLM_3 (its llama_chat_apply_template's output) */
    {CHAT_CHATGLM3,
     "[gMASK]sop<|system|>\n You are a helpful assistant<|user|>\n Hello<|assistant|>\n Hi "
     "there<|user|>\n Who are you<|assistant|>\n    I am an assistant   <|user|>\n Another "
     "question<|assistant|>"},
    /* llama.cpp's LLM_CHAT_TEMPLATE_DEEPSEEK_2 (its llama_chat_apply_template's output) */
    {CHAT_DEEPSEEK2,
     "You are a helpful assistant\n\nUser: Hello\n\nAssistant: Hi there<｜end▁of▁sentence｜>"
     "User: Who are you\n\nAssistant:    I am an assistant   <｜end▁of▁sentence｜>User: "
     "Another question\n\nAssistant:"},
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
    CHECK(chat_apply(CHAT_ZEPHYR, one, 1, false, out, sizeof out) > 0);
    CHECK(strcmp(out, "<|user|>\nHi</s>\n") == 0);
    CHECK(chat_apply(CHAT_ZEPHYR, one, 1, true, out, sizeof out) > 0);
    CHECK(strcmp(out, "<|user|>\nHi</s>\n<|assistant|>\n") == 0);
    CHECK(chat_apply(CHAT_DEEPSEEK3, one, 1, false, out, sizeof out) > 0);
    CHECK(strcmp(out, "<｜User｜>Hi") == 0);
    CHECK(chat_apply(CHAT_OPENCHAT, one, 1, false, out, sizeof out) > 0);
    CHECK(strcmp(out, "GPT4 Correct User: Hi<|end_of_turn|>") == 0);
    /* monarch writes "<s>" before every message but the first, and before the prompt */
    CHECK_EQ(chat_apply(CHAT_MONARCH, NULL, 0, true, out, sizeof out), 13);
    CHECK(strcmp(out, "<s>assistant\n") == 0);
    CHECK(chat_apply(CHAT_MONARCH, one, 1, true, out, sizeof out) > 0);
    CHECK(strcmp(out, "user\nHi</s>\n<s>assistant\n") == 0);
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
    for (int f = CHAT_PLAIN; f < CHAT_N_FAMILIES; f++)
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

/* Which families' replies carry reasoning, and where it begins. */
static void thinking_families(void)
{
    CHECK_EQ(chat_thinking(CHAT_QWEN3), CHAT_THINK_REPLY);
    CHECK_EQ(chat_thinking(CHAT_DEEPSEEK3), CHAT_THINK_REPLY);
    CHECK_EQ(chat_thinking(CHAT_QWEN3_THINKING), CHAT_THINK_OPENED);
    CHECK_EQ(chat_thinking(CHAT_CHATML), CHAT_THINK_NONE);
    CHECK_EQ(chat_thinking(CHAT_LLAMA3), CHAT_THINK_NONE);
    CHECK_EQ(chat_thinking((enum chat_family)99), CHAT_THINK_NONE);
    /* Qwen2.5's chatml has no think markers; Hermes' neither */
    CHECK_EQ(chat_detect(QWEN2), CHAT_CHATML);
    CHECK_EQ(chat_detect(QWEN3), CHAT_QWEN3);
    CHECK_EQ(chat_detect(QWQ), CHAT_QWEN3_THINKING);
    CHECK_EQ(chat_detect(R1_DISTILL), CHAT_DEEPSEEK3);
    /* the opening written with a real line break in the template's string */
    CHECK_EQ(chat_detect("{{ '<|im_start|>assistant\n<think>\n' }}{# </think> #}"),
             CHAT_QWEN3_THINKING);
}

/* An assistant message's reasoning and answer as the thinking templates split it. */
static void think_parts(void)
{
    const char *r, *a;
    size_t n;
    CHECK(chat_think_parts("<think>\nx\n</think>\n\nHi", &r, &n, &a));
    CHECK(n == 1 && *r == 'x' && !strcmp(a, "\n\nHi"));
    /* the reasoning: before the first close, after the last open before it, its line
     * breaks stripped; the answer: after the last close (Qwen3's split('</think>')) */
    CHECK(chat_think_parts("\n<think>a<think>\nb\n\n</think>c</think>d", &r, &n, &a));
    CHECK(n == 1 && *r == 'b' && !strcmp(a, "d"));
    CHECK(chat_think_parts("no open</think>d", &r, &n, &a));
    CHECK(n == 7 && !strncmp(r, "no open", 7) && !strcmp(a, "d"));
    CHECK(!chat_think_parts("<think>unclosed", &r, &n, &a));
    CHECK(n == 0 && !strcmp(a, "<think>unclosed"));
}

/* Qwen3's template, rendered by hand from its text (QWEN3 above) for:
 *   system "You are a helpful assistant", user "Hello",
 *   assistant "<think>\nGreet back.\n</think>\n\nHi there", user "Who are you".
 * The assistant message comes before the last user message (loop.index0 <=
 * ns.last_query_index): its content is message.content.split('</think>')[-1]
 * .lstrip('\n'), "Hi there", written after '<|im_start|>assistant\n' with no block. The
 * generation prompt is '<|im_start|>assistant\n', and with enable_thinking false
 * '<think>\n\n</think>\n\n' after it. */
static void qwen3_drops_earlier_reasoning(void)
{
    static const struct chat_message conv[] = {
        {"system", "You are a helpful assistant"},
        {"user", "Hello"},
        {"assistant", "<think>\nGreet back.\n</think>\n\nHi there"},
        {"user", "Who are you"},
    };
    static const char want[] =
        "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello"
        "<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are "
        "you<|im_end|>\n<|im_start|>assistant\n";
    char out[1024], no_think[1024];
    CHECK_EQ(chat_apply(CHAT_QWEN3, conv, 4, true, out, sizeof out), (int)strlen(want));
    CHECK_MSG(!strcmp(out, want), "%s", out);
    /* enable_thinking true is the template's default */
    CHECK_EQ(chat_apply_think(CHAT_QWEN3, conv, 4, true, true, out, sizeof out), (int)strlen(want));
    CHECK(!strcmp(out, want));
    snprintf(no_think, sizeof no_think, "%s<think>\n\n</think>\n\n", want);
    CHECK_EQ(chat_apply_think(CHAT_QWEN3, conv, 4, true, false, out, sizeof out),
             (int)strlen(no_think));
    CHECK_MSG(!strcmp(out, no_think), "%s", out);
    /* only the generation prompt reads it */
    CHECK(chat_apply_think(CHAT_QWEN3, conv, 4, false, false, out, sizeof out) > 0);
    CHECK(!strcmp(out, "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>"
                       "user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n"
                       "<|im_start|>user\nWho are you<|im_end|>\n"));
    /* the families whose templates have no switch ignore it */
    CHECK(chat_apply_think(CHAT_CHATML, conv + 3, 1, true, false, out, sizeof out) > 0);
    CHECK(!strcmp(out, "<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n"));
}

/* An assistant message after the last user one (loop.index0 > ns.last_query_index) keeps
 * its reasoning: written '<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' +
 * content.lstrip('\n') when it is the last message or has reasoning, else as it is. A
 * user message that is a tool response ("<tool_response>...</tool_response>") is no
 * query. Qwen3's template by hand, no generation prompt. */
static void qwen3_keeps_reasoning_after_the_last_query(void)
{
    static const struct {
        struct chat_message m[4];
        int n;
        const char *want;
    } C[] = {
        {{{"user", "Hi"}, {"assistant", "<think>\nhmm\n</think>\n\nHello"}}, 2,
         "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\n"
         "Hello<|im_end|>\n"},
        /* the last message without reasoning: an empty block all the same */
        {{{"user", "Hi"}, {"assistant", "Hello"}}, 2,
         "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
         "Hello<|im_end|>\n"},
        /* not the last, no reasoning: as it is; the last, with reasoning */
        {{{"user", "Hi"}, {"assistant", "\nA"}, {"assistant", "<think>r</think>\n\nB"}}, 3,
         "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n\nA<|im_end|>\n"
         "<|im_start|>assistant\n<think>\nr\n</think>\n\nB<|im_end|>\n"},
        {{{"user", "Hi"}, {"assistant", "<think>r</think>A"},
          {"user", "<tool_response>\n7\n</tool_response>"}, {"assistant", "B"}}, 4,
         "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\nA"
         "<|im_end|>\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n"
         "<|im_start|>assistant\n<think>\n\n</think>\n\nB<|im_end|>\n"},
        /* no user message at all: none is after the last query */
        {{{"system", "S"}, {"assistant", "<think>r</think>\nA"}}, 2,
         "<|im_start|>system\nS<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"},
    };
    char out[1024];
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        int len = chat_apply(CHAT_QWEN3, C[i].m, C[i].n, false, out, sizeof out);
        CHECK_MSG(len == (int)strlen(C[i].want) && !strcmp(out, C[i].want),
                  "%zu: got\n%s\n---- expected\n%s", i, out, C[i].want);
    }
}

/* QwQ's and Qwen3 Thinking's generation prompt opens the block, whatever enable_thinking
 * says (their templates have no switch); the R1 distills' template drops an earlier
 * reply's reasoning too (content.split('</think>')[-1], nothing stripped after it). */
static void opened_and_r1_templates(void)
{
    static const struct chat_message conv[] = {
        {"user", "Hello"},
        {"assistant", "<think>\nGreet back.\n</think>\n\nHi there"},
        {"user", "Who are you"},
    };
    static const char want_qwq[] =
        "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n"
        "<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n<think>\n";
    char out[1024];
    for (int think = 0; think < 2; think++) {
        CHECK(chat_apply_think(CHAT_QWEN3_THINKING, conv, 3, true, think, out, sizeof out) > 0);
        CHECK_MSG(!strcmp(out, want_qwq), "%s", out);
    }
    CHECK(chat_apply(CHAT_DEEPSEEK3, conv, 3, true, out, sizeof out) > 0);
    CHECK_MSG(!strcmp(out, "<｜User｜>Hello<｜Assistant｜>\n\nHi there<｜end▁of▁sentence｜>"
                           "<｜User｜>Who are you<｜Assistant｜>"), "%s", out);
    CHECK_EQ(strcmp(chat_stop_text(CHAT_QWEN3), "<|im_end|>"), 0);
    CHECK_EQ(strcmp(chat_stop_text(CHAT_QWEN3_THINKING), "<|im_end|>"), 0);
}

static void stop_texts_per_family(void)
{
    CHECK(strcmp(chat_stop_text(CHAT_CHATML), "<|im_end|>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_HERMES), "<|im_end|>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_LLAMA3), "<|eot_id|>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_LLAMA2_SYS), "</s>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_MISTRAL_V7), "</s>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_PLAIN), "\nUser:") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_ZEPHYR), "</s>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_FALCON3), "<|endoftext|>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_DEEPSEEK3), "<｜end▁of▁sentence｜>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_OPENCHAT), "<|end_of_turn|>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_VICUNA), "</s>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_VICUNA_ORCA), "</s>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_DEEPSEEK), "<|EOT|>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_MONARCH), "</s>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_MEGREZ), "<|turn_end|>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_PHI3), "<|end|>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_PHI4), "<|im_end|>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_GRANITE), "<|end_of_text|>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_GEMMA), "<end_of_turn>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_EXAONE3), "[|endofturn|]") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_SMOLLM3), "<|im_end|>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_COMMAND_R), "<|END_OF_TURN_TOKEN|>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_SEED_OSS), "<seed:eos>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_HUNYUAN_DENSE), "<｜hy_place▁holder▁no▁2｜>") == 0);
    CHECK(strcmp(chat_stop_text(CHAT_CHATGLM3), "<|user|>") == 0);
    CHECK_EQ(chat_thinking(CHAT_COMMAND_R), CHAT_THINK_NONE);
    CHECK_EQ(chat_thinking(CHAT_GEMMA), CHAT_THINK_NONE);
    CHECK_EQ(chat_thinking(CHAT_EXAONE3), CHAT_THINK_NONE);
    CHECK_EQ(chat_thinking(CHAT_SMOLLM3), CHAT_THINK_REPLY);
    /* every family's turn end is in what it writes after an assistant message, or is
     * plain's next label (smollm3's system block holds a long default text) */
    const struct chat_message reply[] = {{"user", "q"}, {"assistant", "a"}};
    char out[4096];
    for (int f = CHAT_PLAIN; f < CHAT_N_FAMILIES; f++) {
        CHECK(chat_apply(f, reply, 2, false, out, sizeof out) > 0);
        const char *end = chat_stop_text(f);
        CHECK_MSG(f == CHAT_PLAIN || f == CHAT_FALCON3 || strstr(out, end), "%s: %s not in %s",
                  chat_family_name(f), end, out);
    }
}

/* GLM-4's templates: glm-4-9b-chat's (llama.cpp's chatglm4, its "<|user|>" not taken for
 * zephyr's or falcon3's) and GLM-Z1's (zai-org/GLM-Z1-9B-0414's chat_template.jinja, tools
 * left out): the system messages first, every other message's text after its last
 * "</think>", stripped, and "<think>" opened by the generation prompt; "<|user|>" ends a
 * reply. */
static void glm4_templates(void)
{
    static const char chatglm4[] =
        "[gMASK]<sop>{% for item in messages %}{% if item['content'] %}<|{{ item['role'] }}|>"
        "{{ item['metadata'] }}\n{{ item['content'] }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}";
    static const char z1[] =
        "[gMASK]<sop>\n{%- for msg in messages %}{%- if msg.role == 'system' %}\n<|system|>\n"
        "{{ msg.content }}\n{%- endif %}{%- endfor %}\n"
        "{%- for message in messages if message.role != 'system' %}\n"
        "{%- set visible = message['content'].split('</think>')[-1].strip() %}\n"
        "{%- if message['role'] == 'user' %}\n<|user|>\n{{ visible }}\n"
        "{%- elif message['role'] == 'assistant' %}\n<|assistant|>\n{{ visible }}\n"
        "{%- endif %}\n{%- endfor %}\n{% if add_generation_prompt %}<|assistant|>\n<think>"
        "{% endif %}";
    CHECK_EQ(chat_detect(chatglm4), CHAT_CHATGLM4);
    CHECK_EQ(chat_detect(z1), CHAT_GLM_Z1);
    /* the opening as a Jinja string writes it */
    CHECK_EQ(chat_detect("[gMASK]<sop>{{ '<|assistant|>\\n<think>' }}"), CHAT_GLM_Z1);
    static const struct chat_message conv[] = {
        {"user", "Hello"},
        {"assistant", "<think>\nGreet back.\n</think>\n\nHi there  "},
        {"system", "Be brief."},
        {"user", "  Who are you\n"},
    };
    char out[1024];
    CHECK(chat_apply(CHAT_GLM_Z1, conv, 4, true, out, sizeof out) > 0);
    CHECK_MSG(!strcmp(out, "[gMASK]<sop><|system|>\nBe brief.<|user|>\nHello<|assistant|>\nHi "
                           "there<|user|>\nWho are you<|assistant|>\n<think>"), "%s", out);
    CHECK(chat_apply(CHAT_CHATGLM4, conv, 4, false, out, sizeof out) > 0);
    CHECK_MSG(!strcmp(out, "[gMASK]<sop><|user|>\nHello<|assistant|>\n<think>\nGreet back.\n"
                           "</think>\n\nHi there  <|system|>\nBe brief.<|user|>\n  Who are you\n"),
              "%s", out);
    CHECK_EQ(chat_thinking(CHAT_CHATGLM4), CHAT_THINK_NONE);
    CHECK_EQ(chat_thinking(CHAT_GLM_Z1), CHAT_THINK_OPENED);
    CHECK(!strcmp(chat_stop_text(CHAT_CHATGLM4), "<|user|>"));
    CHECK(!strcmp(chat_stop_text(CHAT_GLM_Z1), "<|user|>"));
}

/* Gemma has no system turn: the system message (trimmed) opens the next user turn, waits
 * past a model turn, a later one replaces an unused one, an empty one writes nothing; as
 * llama.cpp's format. */
/* SmolLM3's template (HuggingFaceTB/SmolLM3-3B's tokenizer_config.json) without tools:
 * today's date, the mode from enable_thinking or the system message's flag, the default
 * instructions of each mode, "/system_override", the unclosed system block, the empty
 * think block of "/no_think" turns, assistant contents' leading line breaks dropped. */
static void smollm3_template(void)
{
    char today[64], head[256], out[4096], want[4096];
    time_t now = time(NULL);
    struct tm tm;
    CHECK(localtime_r(&now, &tm));
    strftime(today, sizeof today, "%d %B %Y", &tm);
    const char *no_think_default =
        "You are a helpful AI assistant named SmolLM, trained by Hugging Face.\n\n";
    const struct chat_message conv[] = {{"system", "Be brief. /no_think"},
                                        {"user", "Hello"},
                                        {"assistant", "\n\nHi there"},
                                        {"user", "Who are you"}};
    snprintf(head, sizeof head,
             "<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\n"
             "Today Date: %s\nReasoning Mode: %%s\n\n## Custom Instructions\n\n", today);
    /* the system message's "/no_think" wins over enable_thinking, and is cut out of it */
    int n = chat_apply_think(CHAT_SMOLLM3, conv, 4, true, true, out, sizeof out);
    char fmt[1024];
    snprintf(fmt, sizeof fmt, "%s%%s", head);
    snprintf(want, sizeof want, fmt, "/no_think",
             "Be brief.\n\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
             "<think>\n\n</think>\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n"
             "<|im_start|>assistant\n<think>\n\n</think>\n");
    CHECK_MSG(n == (int)strlen(want) && !strcmp(out, want), "got\n%s\nwanted\n%s", out, want);
    /* no system message: enable_thinking's mode and its default instructions */
    n = chat_apply_think(CHAT_SMOLLM3, conv + 1, 3, true, false, out, sizeof out);
    snprintf(want, sizeof want, fmt, "/no_think", no_think_default);
    CHECK_MSG(n > 0 && !strncmp(out, want, strlen(want)), "%s", out);
    n = chat_apply(CHAT_SMOLLM3, conv + 1, 3, true, out, sizeof out);
    snprintf(want, sizeof want, fmt, "/think",
             "You are a helpful AI assistant named SmolLM, trained by Hugging Face. Your role");
    CHECK_MSG(n > 0 && !strncmp(out, want, strlen(want)), "%s", out);
    const char *tail = "the conclusion.\n\n<|im_start|>user\nHello<|im_end|>\n"
                       "<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\n"
                       "Who are you<|im_end|>\n<|im_start|>assistant\n";
    CHECK_MSG(n > (int)strlen(tail) && !strcmp(out + n - strlen(tail), tail), "%s", out);
    /* "/think" in the system message against enable_thinking false */
    const struct chat_message think[] = {{"system", "/think  "}, {"user", "Hi"}};
    n = chat_apply_think(CHAT_SMOLLM3, think, 2, true, false, out, sizeof out);
    CHECK(n > 0 && strstr(out, "Reasoning Mode: /think\n") && strstr(out, "Your role") &&
          !strstr(out, "<think>\n\n</think>"));
    /* "/system_override": the system message is the block, closed */
    const struct chat_message over[] = {{"system", "Only this. /system_override /no_think"},
                                        {"user", "Hi"}};
    n = chat_apply_think(CHAT_SMOLLM3, over, 2, true, true, out, sizeof out);
    const char *want_over = "<|im_start|>system\nOnly this.<|im_end|>\n<|im_start|>user\nHi"
                            "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n";
    CHECK_MSG(n == (int)strlen(want_over) && !strcmp(out, want_over), "%s", out);
}

static void gemma_system_messages(void)
{
    char out[512];
    const struct chat_message late[] = {{"user", "a"}, {"system", " first "}, {"system", "second"},
                                        {"assistant", "b"}, {"user", " c "}};
    CHECK(chat_apply(CHAT_GEMMA, late, 5, false, out, sizeof out) > 0);
    CHECK_MSG(!strcmp(out, "<start_of_turn>user\na<end_of_turn>\n<start_of_turn>model\nb"
                           "<end_of_turn>\n<start_of_turn>user\nsecond\n\nc<end_of_turn>\n"),
              "%s", out);
    const struct chat_message empty[] = {{"system", "  "}, {"user", "hi"}};
    CHECK(chat_apply(CHAT_GEMMA, empty, 2, true, out, sizeof out) > 0);
    CHECK_MSG(!strcmp(out, "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"),
              "%s", out);
    const struct chat_message only[] = {{"system", "s"}};
    CHECK(chat_apply(CHAT_GEMMA, only, 1, true, out, sizeof out) > 0);
    CHECK_MSG(!strcmp(out, "<start_of_turn>model\n"), "%s", out);
}

/* Gemma's tokenizer conventions on llmsd's tokenizer (a vocabulary made as Gemma's is:
 * tests/support/gemma_vocab.h): the file's template is the gemma family; its prompt
 * encodes to BOS, then "<start_of_turn>" and "<end_of_turn>" as the one control token
 * each (with parse_special, as the daemon encodes a rendered chat), text after them
 * without the space SPM would prefix (add_space_prefix false), and decodes back to the
 * prompt; "<end_of_turn>" ends generation. Without parse_special the markers are text. */
static void gemma_prompt_tokenizes(void)
{
    const char *src = test_data_path("vocab/ggml-vocab-llama-spm.gguf");
    if (!src) {
        SKIP("no shared test data (vocab/ggml-vocab-llama-spm.gguf)");
        return;
    }
    char path[512], err[ERR_MAX];
    snprintf(path, sizeof path, "%s/gemma-vocab.gguf", test_tmpdir());
    CHECK_MSG(gemma_vocab_write(src, path, err) == 0, "%s", err);
    gguf_file *g = gguf_open(path, err);
    CHECK_MSG(g, "%s", err);
    tokenizer *t = NULL;
    CHECK_MSG(tok_load(g, &t, err) == 0, "%s", err);
    CHECK_EQ(chat_detect_file(g), CHAT_GEMMA);
    gguf_close(g);
    int32_t n_vocab = tok_n_vocab(t), sot = n_vocab - 2, eot = n_vocab - 1;
    const struct chat_message conv[] = {{"system", "Be brief."}, {"user", "Hello there"},
                                        {"assistant", "Hi"}, {"user", "Who are you?"}};
    char prompt[512];
    CHECK(chat_apply(CHAT_GEMMA, conv, 4, true, prompt, sizeof prompt) > 0);
    int32_t ids[256];
    int n = tok_encode(t, prompt, strlen(prompt), true, true, ids, 256);
    CHECK(n > 8 && n < 256);
    CHECK_EQ(ids[0], tok_bos(t));
    CHECK_EQ(ids[1], sot);
    int n_sot = 0, n_eot = 0;
    for (int i = 0; i < n; i++) {
        n_sot += ids[i] == sot;
        n_eot += ids[i] == eot;
    }
    CHECK_EQ(n_sot, 4);
    CHECK_EQ(n_eot, 3);
    /* "user" right after the marker: no space prefixed */
    char piece[64];
    CHECK(tok_piece(t, ids[2], piece, sizeof piece) > 0);
    CHECK_MSG(piece[0] != ' ', "'%s'", piece);
    char back[512];
    CHECK_EQ(tok_decode(t, ids, n, true, true, back, sizeof back), (int)strlen(prompt));
    CHECK_MSG(!strcmp(back, prompt), "%s", back);
    CHECK(tok_is_eog(t, eot));
    CHECK(!tok_is_eog(t, sot));
    int m = tok_encode(t, prompt, strlen(prompt), true, false, ids, 256);
    for (int i = 0; i < m && m > 0; i++)
        CHECK(ids[i] != sot && ids[i] != eot);
    tok_free(t);
}

int main(void)
{
    RUN(detects_real_templates);
    RUN(detects_more_llama_and_qwen_families);
    RUN(detects_phi_and_granite);
    RUN(detects_hermes_by_its_tool_use_template);
    RUN(detects_family_names);
    RUN(formats_match_llama_cpp);
    RUN(generation_prompt_is_optional);
    RUN(buffer_too_small_is_truncated_and_sized);
    RUN(unknown_role_and_bad_input_are_errors);
    RUN(thinking_families);
    RUN(think_parts);
    RUN(qwen3_drops_earlier_reasoning);
    RUN(qwen3_keeps_reasoning_after_the_last_query);
    RUN(opened_and_r1_templates);
    RUN(stop_texts_per_family);
    RUN(smollm3_template);
    RUN(gemma_system_messages);
    RUN(gemma_prompt_tokenizes);
    RUN(glm4_templates);
    return test_finish();
}
