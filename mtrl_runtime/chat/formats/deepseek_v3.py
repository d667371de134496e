"""``deepseek_v3``: DeepSeek V3 / V3.1 / R1 — calls between ``<｜tool▁calls▁begin｜>`` and ``<｜tool▁calls▁end｜>``.

Each call is ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`` followed by a
fenced JSON block (V3, R1) or ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}``
(V3.1), closed by ``<｜tool▁call▁end｜>``. Reasoning (R1, V3.1 thinking) is a
``<think>`` block, dropped from earlier turns by the family's templates.
"""

from __future__ import annotations

import json
import re
from typing import Any, Collection

from .._template_pieces import JSON_ARGUMENTS, TOOLS_AS_JSON_LINES, split_system
from .._toolparse import ParsedReply
from ._base import (
    FormatDefaults, ReasoningHistory, call_from_json, reply, split_reasoning, template_text, vocab_has,
)

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"

TEMPLATE = (
    "{{- bos_token -}}\n"
    + split_system()
    + """{{- system_text -}}
{%- if tools -%}
  {{- '\\n\\n## Tools\\nYou have access to the following tools:' -}}
  """ + TOOLS_AS_JSON_LINES + """
  {{- '\\nTo call tools, reply with <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n' -}}
  {{- 'ARGUMENTS\\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>' -}}
{%- endif -%}
{%- for message in rest -%}
  {%- if message['role'] == 'user' -%}
    {{- '<｜User｜>' + message['content'] -}}
  {%- elif message['role'] == 'tool' -%}
    {%- if loop.first or loop.previtem['role'] != 'tool' -%}{{- '<｜tool▁outputs▁begin｜>' -}}{%- endif -%}
    {{- '<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>' -}}
    {%- if loop.last or loop.nextitem['role'] != 'tool' -%}{{- '<｜tool▁outputs▁end｜>' -}}{%- endif -%}
  {%- elif message['role'] == 'assistant' -%}
    {%- if loop.first or loop.previtem['role'] != 'tool' -%}{{- '<｜Assistant｜>' -}}{%- endif -%}
    {{- message['content'] or '' -}}
    {%- if message['tool_calls'] -%}
      {{- '<｜tool▁calls▁begin｜>' -}}
      {%- for call in message['tool_calls'] -%}
        {%- set fn = call['function'] -%}
        {{- '<｜tool▁call▁begin｜>function<｜tool▁sep｜>' + fn['name'] + '\\n```json\\n' -}}
        {{- """ + JSON_ARGUMENTS + """ + '\\n```<｜tool▁call▁end｜>' -}}
      {%- endfor -%}
      {{- '<｜tool▁calls▁end｜>' -}}
    {%- endif -%}
    {{- eos_token -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt and (not messages or messages[-1]['role'] != 'tool') -%}{{- '<｜Assistant｜>' -}}{%- endif -%}"""
)

_FENCED = re.compile(r"\A\s*(?:function)?\s*" + re.escape(SEP) + r"\s*([^\n`]+?)\s*\n```(?:json)?\n(.*)\n```\s*\Z", re.S)


class DeepSeekV3Format(FormatDefaults):
    name = "deepseek_v3"
    template = TEMPLATE
    reasoning_history = ReasoningHistory.DROPPED
    tool_call_opener = CALLS_BEGIN + CALL_BEGIN
    vllm_tool_parser = "deepseek_v3"  # vLLM's --tool-call-parser for this family

    def detect(self, tokenizer: Any) -> bool:
        return vocab_has(tokenizer, CALLS_BEGIN) or CALLS_BEGIN in template_text(tokenizer)

    def forced_prefix(self, tool_name: str | None) -> str:
        opener = self.tool_call_opener + "function" + SEP
        return opener if tool_name is None else f"{opener}{tool_name}\n```json\n"

    def parse(self, text: str, tool_names: Collection[str] | None = None, *, calls: bool = True) -> ParsedReply:
        reasoning, rest = split_reasoning(text)
        at = rest.find(CALLS_BEGIN)
        if not calls or at < 0:
            return reply(rest, [], 0, reasoning, None if not calls else tool_names)
        end = rest.find(CALLS_END, at)
        body = rest[at + len(CALLS_BEGIN) : end if end >= 0 else len(rest)]
        found = _calls(body) if end >= 0 else None
        if found is None:
            return reply(rest, [], 1, reasoning, tool_names)
        return reply(rest[:at] + rest[end + len(CALLS_END) :], found, 0, reasoning, tool_names)


def _calls(body: str) -> list[dict[str, Any]] | None:
    parts = body.split(CALL_BEGIN)
    if parts[0].strip():
        return None
    found = []
    for part in parts[1:]:
        if not part.rstrip().endswith(CALL_END):
            return None
        part = part.rstrip()[: -len(CALL_END)]
        fenced = _FENCED.match(part)
        if fenced is not None:  # V3 / R1: function<sep>NAME, then fenced JSON
            name, args = fenced.group(1), fenced.group(2)
        else:  # V3.1: NAME<sep>{json}
            name, _, args = part.partition(SEP)
        try:
            call = call_from_json({"name": name.strip(), "arguments": json.loads(args)})
        except ValueError:
            return None
        if call is None:
            return None
        found.append(call)
    return found or None


DEEPSEEK_V3 = DeepSeekV3Format()

__all__ = ["DEEPSEEK_V3", "DeepSeekV3Format"]
