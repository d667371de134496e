"""``mistral``: Mistral's ``[TOOL_CALLS]`` — a JSON list of calls (v3 tokenizers) or ``NAME[ARGS]{json}`` (v11+).

Tools are listed in ``[AVAILABLE_TOOLS]`` before the last user message;
results come back in ``[TOOL_RESULTS]``. Text before ``[TOOL_CALLS]`` is the
content. Reasoning, in Magistral, is a ``[THINK]`` block.
"""

from __future__ import annotations

import json
import secrets
import string
from typing import Any, Collection

from .._template_pieces import JSON_ARGUMENTS, split_system
from .._toolparse import ParsedReply
from ._base import (
    FormatDefaults, ReasoningHistory, call_from_json, reply, split_reasoning, template_text, vocab_has,
)

# Written for render speed, token for token the plain one (tests/test_mistral_template.py keeps that as REFERENCE):
# one pass over the roles, not a scan of the later messages per user message; each tool result's JSON key by key
# (the text of `{'content': ..., 'call_id': ...} | tojson`, without a dict and an encoder per result); a call's
# body written twice, for the first call and after ', ', as `loop.first` is a sandboxed attribute lookup per call.
# one call (``call``) as a JSON object, its id after its arguments when it has one
_CALL = (
    """        {%- set fn = call['function'] -%}
        {{- '{"name": ' + (fn['name'] | tojson) + ', "arguments": ' -}}
        {{- """ + JSON_ARGUMENTS + """ -}}
        {%- if call['id'] -%}{{- ', "id": ' + (call['id'] | tojson) -}}{%- endif -%}
        {{- '}' -}}
"""
)
TEMPLATE = (
    "{{- bos_token -}}\n"
    + split_system()
    + """{%- set roles = rest | map(attribute='role') | list -%}
{%- for message in rest -%}
  {%- if message['role'] == 'user' -%}
    {%- set last_user = 'user' not in roles[loop.index0 + 1:] -%}
    {%- if tools and last_user -%}
      {{- '[AVAILABLE_TOOLS]' + (tools | tojson) + '[/AVAILABLE_TOOLS]' -}}
    {%- endif -%}
    {{- '[INST]' -}}
    {%- if system_text and last_user -%}{{- system_text + '\\n\\n' -}}{%- endif -%}
    {{- message['content'] + '[/INST]' -}}
  {%- elif message['role'] == 'tool' -%}
    {{- '[TOOL_RESULTS]{"content": ' + (message['content'] | tojson) -}}
    {{- ', "call_id": ' + ((message['tool_call_id'] or '') | tojson) + '}[/TOOL_RESULTS]' -}}
  {%- elif message['role'] == 'assistant' -%}
    {{- message['content'] or '' -}}
    {%- if message['tool_calls'] -%}
      {{- '[TOOL_CALLS][' -}}
      {%- for call in message['tool_calls'][:1] -%}
""" + _CALL + """\
      {%- endfor -%}
      {%- for call in message['tool_calls'][1:] -%}
        {{- ', ' -}}
""" + _CALL + """\
      {%- endfor -%}
      {{- ']' -}}
    {%- endif -%}
    {{- eos_token -}}
  {%- endif -%}
{%- endfor -%}"""
)

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"


class MistralFormat(FormatDefaults):
    name = "mistral"
    template = TEMPLATE
    reasoning_history = ReasoningHistory.DROPPED
    tool_call_opener = TOOL_CALLS
    vllm_tool_parser = "mistral"  # vLLM's --tool-call-parser for this family

    def detect(self, tokenizer: Any) -> bool:
        return vocab_has(tokenizer, TOOL_CALLS) or "[TOOL_CALLS]" in template_text(tokenizer)

    def named_call(self, tool_name: str) -> str:
        return TOOL_CALLS + '[{"name": ' + json.dumps(tool_name, ensure_ascii=False) + ', "arguments": '

    def parse(self, text: str, tool_names: Collection[str] | None = None, *, calls: bool = True) -> ParsedReply:
        reasoning, rest = split_reasoning(text, "[THINK]", "[/THINK]")
        at = rest.find(TOOL_CALLS)
        if not calls or at < 0:
            return reply(rest, [], 0, reasoning, None if not calls else tool_names)
        found = _calls(rest[at:])
        if found is None:
            return reply(rest, [], 1, reasoning, tool_names)
        return reply(rest[:at], found, 0, reasoning, tool_names)


def _calls(text: str) -> list[dict[str, Any]] | None:
    """Every call after each ``[TOOL_CALLS]`` (None if any part does not read as calls)."""
    found: list[dict[str, Any]] = []
    for part in text.split(TOOL_CALLS)[1:]:
        part = part.strip()
        if ARGS in part:  # v11+: NAME[ARGS]{json}
            name, _, args = part.partition(ARGS)
            try:
                call = call_from_json({"name": name.strip(), "arguments": json.loads(args)})
            except ValueError:
                return None
            calls = [_with_id(call, {})]
        else:  # v3: a JSON list of {"name", "arguments"}
            try:
                data = json.loads(part)
            except ValueError:
                return None
            data = data if isinstance(data, list) else [data]
            calls = [_with_id(call_from_json(item), item) for item in data]
        if not calls or any(c is None for c in calls):
            return None
        found.extend(calls)  # type: ignore[arg-type]
    return found or None


def _with_id(call: dict[str, Any] | None, item: Any) -> dict[str, Any] | None:
    """The call with the id the model wrote (history renders it back, so keeping it keeps the sequence exact), else
    a fresh one of the shape Mistral's tokenizers require: 9 letters and digits."""
    if call is not None:
        written = item.get("id") if isinstance(item, dict) else None
        call["id"] = written if isinstance(written, str) and written else "".join(
            secrets.choice(_ID_ALPHABET) for _ in range(9))
    return call


_ID_ALPHABET = string.ascii_letters + string.digits

MISTRAL = MistralFormat()

__all__ = ["MISTRAL", "MistralFormat"]
