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
from .._toolparse import ParsedReply, parse_tool_calls
from ._base import ReasoningHistory, split_reasoning, template_text, vocab_has

# Qwen3's documented layout: tools as JSON lines in <tools> in the system turn;
# an assistant turn after the last user message keeps its <think> block, earlier
# ones lose it; enable_thinking=false opens and closes an empty think block.
QWEN3_TEMPLATE = """{%- if tools or (messages and messages[0]['role'] == 'system') -%}
  {{- '<|im_start|>system\\n' -}}
  {%- if messages and messages[0]['role'] == 'system' -%}{{- messages[0]['content'] -}}{%- endif -%}
  {%- if tools -%}
    {%- if messages and messages[0]['role'] == 'system' -%}{{- '\\n\\n' -}}{%- endif -%}
    {{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' -}}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}
    {%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments ' -}}
    {{- 'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' -}}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>' -}}
  {%- endif -%}
  {{- '<|im_end|>\\n' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- if message['role'] == 'system' and loop.first -%}
  {%- elif message['role'] == 'tool' -%}
    {%- if loop.first or loop.previtem['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' -}}
    {%- if loop.last or loop.nextitem['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
  {%- elif message['role'] == 'assistant' -%}
    {{- '<|im_start|>assistant\\n' -}}
    {%- if message['reasoning_content'] and not (messages[loop.index0 + 1:] | selectattr('role', 'equalto', 'user') | first) -%}
      {{- '<think>\\n' + message['reasoning_content'] + '\\n</think>\\n\\n' -}}
    {%- endif -%}
    {{- message['content'] or '' -}}
    {%- for call in message['tool_calls'] or [] -%}
      {%- set fn = call['function'] -%}
      {%- if message['content'] or not loop.first -%}{{- '\\n' -}}{%- endif -%}
      {{- '<tool_call>\\n{"name": ' + (fn['name'] | tojson) + ', "arguments": ' -}}
      {{- (fn['arguments'] if fn['arguments'] is string else (fn['arguments'] | tojson)) + '}\\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\\n' -}}
  {%- else -%}
    {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\\n' -}}
  {%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}
{%- endif -%}"""


class HermesFormat:
    name = "hermes"
    template = CHATML_TOOLS_TEMPLATE
    reasoning_history = ReasoningHistory.DROPPED
    tool_call_opener = "<tool_call>\n"
    call_openers = (tool_call_opener,)
    held_headers: tuple[tuple[str, str], ...] = ()
    stop_tokens: tuple[str, ...] = ()
    history_terminators: tuple[tuple[str, str], ...] = ()  # the eos closes a reply as the template does
    # Qwen3's thinking checkpoints (2507) open <think> in the generation prompt; the reply continues it
    reasoning_openers = (("<think>\n", "\n</think>\n\n"),)
    vllm_tool_parser = "hermes"  # vLLM's --tool-call-parser for this family

    def detect(self, tokenizer: Any) -> bool:
        return vocab_has(tokenizer, "<|im_start|>") or "<tool_call>" in template_text(tokenizer)

    def forced_prefix(self, tool_name: str | None) -> str:
        if tool_name is None:
            return self.tool_call_opener
        return '<tool_call>\n{"name": ' + json.dumps(tool_name, ensure_ascii=False) + ', "arguments": '

    def parse(self, text: str, tool_names: Collection[str] | None = None, *, calls: bool = True) -> ParsedReply:
        reasoning, rest = split_reasoning(text)
        if not calls:
            return ParsedReply(content=rest if reasoning is None else (rest.strip() or None), reasoning=reasoning)
        parsed = parse_tool_calls(rest, tool_names)
        return ParsedReply(parsed.content, parsed.tool_calls, parsed.malformed, parsed.unknown_tools, reasoning)


HERMES = HermesFormat()

__all__ = ["HERMES", "QWEN3_TEMPLATE", "HermesFormat"]
