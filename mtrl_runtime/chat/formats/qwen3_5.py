"""``qwen3_5``: Qwen3.5 and Qwen3.6 — Qwen3-Coder's XML calls in a template that always thinks.

Calls are written as Qwen3-Coder writes them (``<tool_call><function=NAME>
<parameter=KEY>value</parameter></function></tool_call>``) and parsed by the
same reader. What differs is the template: the tool list comes before the
system text; the generation prompt opens ``<think>\\n`` (``enable_thinking:
false`` writes an empty ``<think>\\n\\n</think>\\n\\n`` instead), so the model's
reply starts inside its reasoning and closes it with ``</think>``; every
assistant turn after the last user query is rendered with its ``<think>``
block (an empty one when the client sent no reasoning back), earlier turns
without. Qwen3.6 adds ``preserve_thinking``: true keeps every turn's block.
Non-string argument values are written as JSON (Qwen3.6; Qwen3.5 wrote them
with Python's ``str``, so ``true`` there reads ``True``).

``template`` is the project's rendering of the published Qwen3.6 template
for text conversations (no images or video), token-identical to it on the
conversations ``tests/test_chat_formats_published.py`` renders with the
real template (kept in ``tests/data/templates/``).
"""

from __future__ import annotations

from typing import Any

from .._template_pieces import TOOLS_AS_JSON_LINES, XML_CALL
from ._base import ReasoningHistory, template_text
from .qwen3_coder import Qwen3CoderFormat

_TOOLS_PREAMBLE = (
    "# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>"
)
_TOOLS_INSTRUCTIONS = (
    "\\n</tools>\\n\\nIf you choose to call a function ONLY reply in the following format with NO suffix:\\n\\n"
    "<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>\\nvalue_1\\n</parameter>\\n"
    "<parameter=example_parameter_2>\\nThis is the value for the second parameter\\nthat can span\\nmultiple lines\\n"
    "</parameter>\\n</function>\\n</tool_call>\\n\\n<IMPORTANT>\\nReminder:\\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested "
    "within <tool_call></tool_call> XML tags\\n- Required parameters MUST be specified\\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function call, "
    "but NOT after\\n- If there is no function call available, answer the question like normal with your current "
    "knowledge and do not tell the user about function calls\\n</IMPORTANT>"
)

TEMPLATE = (
    """{%- set has_system = messages and messages[0]['role'] == 'system' -%}
{%- if tools -%}
  {{- '<|im_start|>system\\n""" + _TOOLS_PREAMBLE + """' -}}
  """ + TOOLS_AS_JSON_LINES + """
  {{- '""" + _TOOLS_INSTRUCTIONS + """' -}}
  {%- if has_system and messages[0]['content'] | trim -%}{{- '\\n\\n' + (messages[0]['content'] | trim) -}}{%- endif -%}
  {{- '<|im_end|>\\n' -}}
{%- elif has_system -%}
  {{- '<|im_start|>system\\n' + (messages[0]['content'] | trim) + '<|im_end|>\\n' -}}
{%- endif -%}
{%- set ns = namespace(last_query=-1) -%}
{%- for message in messages -%}
  {%- set text = message['content'] | trim -%}
  {%- if message['role'] == 'user' and not (text.startswith('<tool_response>') and text.endswith('</tool_response>')) -%}
    {%- set ns.last_query = loop.index0 -%}
  {%- endif -%}
{%- endfor -%}
{%- if ns.last_query < 0 -%}{{- raise_exception('No user query found in messages.') -}}{%- endif -%}
{%- for message in messages -%}
  {%- set content = message['content'] | trim -%}
  {%- if message['role'] == 'system' -%}
    {%- if not loop.first -%}{{- raise_exception('System message must be at the beginning.') -}}{%- endif -%}
  {%- elif message['role'] == 'user' -%}
    {{- '<|im_start|>user\\n' + content + '<|im_end|>\\n' -}}
  {%- elif message['role'] == 'assistant' -%}
    {%- if message['reasoning_content'] is string -%}
      {%- set reasoning = message['reasoning_content'] -%}
    {%- elif '</think>' in content -%}
      {%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') -%}
      {%- set content = content.split('</think>')[-1].lstrip('\\n') -%}
    {%- else -%}
      {%- set reasoning = '' -%}
    {%- endif -%}
    {{- '<|im_start|>assistant\\n' -}}
    {%- if preserve_thinking is true or loop.index0 > ns.last_query -%}
      {{- '<think>\\n' + (reasoning | trim) + '\\n</think>\\n\\n' -}}
    {%- endif -%}
    {{- content -}}
    {%- for call in message['tool_calls'] or [] -%}
      {%- set fn = call['function'] if call['function'] is defined else call -%}
      {%- if not loop.first -%}{{- '\\n' -}}{%- elif content | trim -%}{{- '\\n\\n' -}}{%- endif -%}
""" + XML_CALL + """\
    {%- endfor -%}
    {{- '<|im_end|>\\n' -}}
  {%- elif message['role'] == 'tool' -%}
    {%- if not loop.first and loop.previtem['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' -}}
    {%- if loop.last or loop.nextitem['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
  {%- else -%}
    {{- raise_exception('Unexpected message role.') -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\\n' -}}
  {%- if enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- else -%}{{- '<think>\\n' -}}{%- endif -%}
{%- endif -%}"""
)


class Qwen35Format(Qwen3CoderFormat):
    """Qwen3.5 / Qwen3.6: the Qwen3-Coder call reader, the always-thinking template."""

    name = "qwen3_5"
    template = TEMPLATE
    # earlier turns' reasoning is dropped before the last user query (kept with preserve_thinking: true)
    reasoning_history = ReasoningHistory.DROPPED
    # the generation prompt opens <think> (unless enable_thinking: false): the reply continues it; a forced call
    # closes it empty first, as the template renders a turn without reasoning
    reasoning_openers = (("<think>\n", "\n</think>\n\n"),)
    vllm_tool_parser = "qwen3_coder"  # vLLM serves Qwen3.5/3.6 with --tool-call-parser qwen3_coder

    def detect(self, tokenizer: Any) -> bool:
        # Qwen3-Coder's template writes <function= calls and never thinks; Qwen3.5's and Qwen3.6's think
        text = template_text(tokenizer)
        return "<function=" in text and "<think>" in text


QWEN3_5 = Qwen35Format()

__all__ = ["QWEN3_5", "Qwen35Format"]
