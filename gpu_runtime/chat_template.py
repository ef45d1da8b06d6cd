"""The Qwen3-style chat template Kiln's tiny model ships with, and its special tokens. Imports no Django.

The template follows Qwen3's layout (`<|im_start|>role\\n...<|im_end|>\\n`, a `# Tools` system block,
`<tool_call>` / `<tool_response>` wrappers, reasoning kept only for assistant turns after the last
user query) with one deliberate difference in the generation prompt: with thinking on, the template
itself opens the reasoning block (`<|im_start|>assistant\\n<think>\\n`), as Qwen3-Thinking-2507 and
later templates do. The `<think>` opener is then template-owned, never sampled, which is what
reference-spec §4.5 assumes when it masks actions from the first reasoning token. With
`enable_thinking=False` the assistant turn is prefilled with an empty `<think>\\n\\n</think>\\n\\n`
block, exactly like Qwen3.
"""

from __future__ import annotations

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

# Control tokens: never produced by ordinary text, removed by decode(skip_special_tokens=True).
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
# Added but not "special": they must survive decoding so reasoning can be split from content.
MARKUP_TOKENS = [
    THINK_OPEN,
    THINK_CLOSE,
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]

# Whitespace control: every tag trims to its left ({%- / {{-), so the template's own line breaks
# and indentation never reach the rendered prompt; every emitted newline is written explicitly.
CHAT_TEMPLATE = r"""
{%- macro render_content(content) -%}
  {%- if content is string -%}{{- content -}}
  {%- elif content is iterable and content is not mapping -%}
    {%- for part in content -%}{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}{%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- if tools %}
  {{- '<|im_start|>system\n' }}
  {%- if messages and messages[0].role == 'system' %}
    {{- render_content(messages[0].content) + '\n\n' }}
  {%- endif %}
  {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
  {%- for tool in tools %}
    {{- '\n' + (tool | tojson) }}
  {%- endfor %}
  {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages and messages[0].role == 'system' %}
  {{- '<|im_start|>system\n' + render_content(messages[0].content) + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(last_query_index=-1) %}
{%- for message in messages %}
  {%- if message.role == 'user' %}{%- set ns.last_query_index = loop.index0 %}{%- endif %}
{%- endfor %}
{%- for message in messages %}
  {%- set content = render_content(message.content) %}
  {%- if message.role == 'system' %}
    {%- if not loop.first %}{{- '<|im_start|>system\n' + content + '<|im_end|>\n' }}{%- endif %}
  {%- elif message.role == 'user' %}
    {{- '<|im_start|>user\n' + content + '<|im_end|>\n' }}
  {%- elif message.role == 'assistant' %}
    {%- set reasoning = message.reasoning_content if message.reasoning_content is string else '' %}
    {%- if '</think>' in content %}
      {%- set reasoning = content.split('</think>')[0].split('<think>')[-1] %}
      {%- set content = content.split('</think>')[-1] %}
    {%- endif %}
    {{- '<|im_start|>assistant\n' }}
    {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning) %}
      {{- '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' }}
    {%- endif %}
    {{- content.lstrip('\n') }}
    {%- if message.tool_calls %}
      {%- for tool_call in message.tool_calls %}
        {%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
        {{- '\n<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
        {%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
        {{- '}\n</tool_call>' }}
      {%- endfor %}
    {%- endif %}
    {{- '<|im_end|>\n' }}
  {%- elif message.role == 'tool' %}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
    {{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
  {{- '<|im_start|>assistant\n' }}
  {%- if enable_thinking is defined and enable_thinking is false %}
    {{- '<think>\n\n</think>\n\n' }}
  {%- else %}
    {{- '<think>\n' }}
  {%- endif %}
{%- endif %}
""".strip()
