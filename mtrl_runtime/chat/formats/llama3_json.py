"""``llama3_json``: Llama 3.1 / 3.2 / 3.3 — a call is a JSON object ``{"name": ..., "parameters": {...}}``.

The model writes the call as its whole reply, optionally after
``<|python_tag|>``; several calls are separated by ``;``. A reply that starts
like a call (``{"name"``) but does not decode is malformed and kept as text.
Tool results come back in the ``ipython`` role. Llama 3 has no reasoning text.
"""

from __future__ import annotations

import json
from typing import Any, Collection

from .._template_pieces import JSON_ARGUMENTS, split_system
from .._toolparse import ParsedReply
from ._base import FormatDefaults, ReasoningHistory, call_from_json, reply, template_text, vocab_has

TEMPLATE = (
    "{{- bos_token -}}\n"
    + split_system()
    + """{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' -}}
{%- if tools -%}{{- 'Environment: ipython\\n\\n' -}}{%- endif -%}
{{- system_text -}}
{%- if tools -%}
  {{- '\\n\\nGiven the following functions, please respond with a JSON for a function call with its proper arguments ' -}}
  {{- 'that best answers the given prompt.\\n\\nRespond in the format {"name": function name, "parameters": ' -}}
  {{- 'dictionary of argument name and its value}. Do not use variables.' -}}
  {%- for tool in tools -%}{{- '\\n\\n' + (tool | tojson(indent=4)) -}}{%- endfor -%}
{%- endif -%}
{{- '<|eot_id|>' -}}
{%- for message in rest -%}
  {%- if message['role'] == 'tool' -%}
    {{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' -}}
  {%- elif message['role'] == 'assistant' -%}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' + (message['content'] or '') -}}
    {%- for call in message['tool_calls'] or [] -%}
      {%- set fn = call['function'] -%}
      {%- if not loop.first -%}{{- '; ' -}}{%- endif -%}
      {{- '{"name": ' + (fn['name'] | tojson) + ', "parameters": ' -}}
      {{- """ + JSON_ARGUMENTS + """ + '}' -}}
    {%- endfor -%}
    {{- '<|eot_id|>' -}}
  {%- else -%}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"""
)

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonFormat(FormatDefaults):
    name = "llama3_json"
    template = TEMPLATE
    reasoning_history = ReasoningHistory.NONE
    tool_call_opener = '{"name": "'
    call_openers = (tool_call_opener, PYTHON_TAG)  # a call may also follow <|python_tag|>
    stop_tokens = ("<|eom_id|>", "<|eot_id|>")
    # a call after <|python_tag|> ends with <|eom_id|>; this template closes every assistant message with <|eot_id|>
    history_terminators = (("<|eom_id|>", "<|eot_id|>"),)
    vllm_tool_parser = "llama3_json"  # vLLM's --tool-call-parser for this family

    def detect(self, tokenizer: Any) -> bool:
        return vocab_has(tokenizer, PYTHON_TAG, "<|eom_id|>") or "<|start_header_id|>" in template_text(tokenizer)

    def named_call(self, tool_name: str) -> str:
        return '{"name": ' + json.dumps(tool_name, ensure_ascii=False) + ', "parameters": '

    def parse(self, text: str, tool_names: Collection[str] | None = None, *, calls: bool = True) -> ParsedReply:
        if not calls:
            return ParsedReply(content=text)
        tagged = text.find(PYTHON_TAG)
        head, body = (text[:tagged], text[tagged + len(PYTHON_TAG) :]) if tagged >= 0 else ("", text)
        stripped = body.strip()
        if not stripped.startswith("{"):
            return reply(text, [], 0, None, tool_names)
        found = _calls(stripped)
        if found is None:
            looks_like_call = tagged >= 0 or stripped.replace(" ", "").startswith('{"name"')
            return reply(text, [], int(looks_like_call), None, tool_names)
        return reply(head, found, 0, None, tool_names)


def _calls(body: str) -> list[dict[str, Any]] | None:
    """The calls of a reply made of JSON objects separated by ``;`` (None unless every part is one)."""
    decoder = json.JSONDecoder()
    found, pos = [], 0
    while pos < len(body):
        try:
            data, end = decoder.raw_decode(body, pos)
        except ValueError:
            return None
        call = call_from_json(data, "parameters")
        if call is None:
            return None
        found.append(call)
        pos = end
        while pos < len(body) and body[pos] in " \n;":
            pos += 1
    return found or None


LLAMA3_JSON = Llama3JsonFormat()

__all__ = ["LLAMA3_JSON", "Llama3JsonFormat"]
