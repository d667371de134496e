"""``hermes``: Qwen2.5 / Qwen3 / Qwen3.5 and SmolLM2 — ``<tool_call>{json}</tool_call>`` calls, ``<think>`` reasoning.

Calls are JSON objects ``{"name": ..., "arguments": {...}}`` in
``<tool_call>`` blocks (``chat._toolparse``); reasoning is a ``<think>``
block before the answer. Qwen3's template drops earlier turns' reasoning from
history (only turns after the last user message keep it), so the format
reports ``ReasoningHistory.DROPPED``. ``template`` is the project's ChatML
tools template, token-identical to what mtrl rendered before formats existed;
``QWEN3_TEMPLATE`` is the project's rendering of Qwen3's documented format
with thinking, used in tests and by tokenizers that carry none of their own.
"""

from __future__ import annotations

import json
from typing import Any, Collection

from .._template import CHATML_TOOLS_TEMPLATE
from .._template_pieces import CHATML_OTHER_ROLES, CHATML_TOOL_RESULTS, HERMES_CALL, HERMES_TOOLS_LIST
from .._toolparse import ParsedReply, parse_tool_calls
from ._base import FormatDefaults, ReasoningHistory, split_reasoning, template_text, vocab_has

# Qwen3's documented layout: tools as JSON lines in <tools> in the system turn;
# an assistant turn after the last user message keeps its <think> block, earlier
# ones lose it; enable_thinking=false opens and closes an empty think block.
QWEN3_TEMPLATE = (
    """{%- if tools or (messages and messages[0]['role'] == 'system') -%}
  {{- '<|im_start|>system\\n' -}}
  {%- if messages and messages[0]['role'] == 'system' -%}{{- messages[0]['content'] -}}{%- endif -%}
  {%- if tools -%}
    {%- if messages and messages[0]['role'] == 'system' -%}{{- '\\n\\n' -}}{%- endif -%}
    {{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' -}}
""" + HERMES_TOOLS_LIST + """\
  {%- endif -%}
  {{- '<|im_end|>\\n' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- if message['role'] == 'system' and loop.first -%}
  {%- elif message['role'] == 'tool' -%}
""" + CHATML_TOOL_RESULTS + """\
  {%- elif message['role'] == 'assistant' -%}
    {{- '<|im_start|>assistant\\n' -}}
    {%- if message['reasoning_content'] and not (messages[loop.index0 + 1:] | selectattr('role', 'equalto', 'user') | first) -%}
      {{- '<think>\\n' + message['reasoning_content'] + '\\n</think>\\n\\n' -}}
    {%- endif -%}
    {{- message['content'] or '' -}}
    {%- for call in message['tool_calls'] or [] -%}
      {%- set fn = call['function'] -%}
""" + HERMES_CALL + """\
    {%- endfor -%}
    {{- '<|im_end|>\\n' -}}
""" + CHATML_OTHER_ROLES + """\
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\\n' -}}
  {%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}
{%- endif -%}"""
)


class HermesFormat(FormatDefaults):
    name = "hermes"
    template = CHATML_TOOLS_TEMPLATE
    reasoning_history = ReasoningHistory.DROPPED
    tool_call_opener = "<tool_call>\n"
    # Qwen3's thinking checkpoints (2507) open <think> in the generation prompt; the reply continues it
    reasoning_openers = (("<think>\n", "\n</think>\n\n"),)
    vllm_tool_parser = "hermes"  # vLLM's --tool-call-parser for this family

    def detect(self, tokenizer: Any) -> bool:
        return vocab_has(tokenizer, "<|im_start|>") or "<tool_call>" in template_text(tokenizer)

    def named_call(self, tool_name: str) -> str:
        return '<tool_call>\n{"name": ' + json.dumps(tool_name, ensure_ascii=False) + ', "arguments": '

    def parse(self, text: str, tool_names: Collection[str] | None = None, *, calls: bool = True) -> ParsedReply:
        reasoning, rest = split_reasoning(text)
        if not calls:
            return ParsedReply(content=rest if reasoning is None else (rest.strip() or None), reasoning=reasoning)
        parsed = parse_tool_calls(rest, tool_names)
        return ParsedReply(parsed.content, parsed.tool_calls, parsed.malformed, parsed.unknown_tools, reasoning)


HERMES = HermesFormat()

__all__ = ["HERMES", "QWEN3_TEMPLATE", "HermesFormat"]
