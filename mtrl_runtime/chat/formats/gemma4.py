"""``gemma4``: Gemma 4 — ``<|tool_call>call:NAME{key:value}<tool_call|>`` calls, ``<|channel>thought`` reasoning.

Turns are ``<|turn>ROLE\\n ... <turn|>\\n`` (the assistant's role is
``model``). Tools are declared in the system turn as ``<|tool>declaration:
NAME{...}<tool|>``. A call's arguments are written in Gemma's own notation,
not JSON: keys bare, strings between ``<|"|>`` tokens, numbers and
``true``/``false``/``null`` as literals, objects ``{...}`` and lists
``[...]``. The model ends a call with ``<|tool_response>`` (a stop token:
the tool's result follows it) and an answer with ``<turn|>``. A tool loop is
one model turn: the results are written inside it
(``<|tool_response>response:NAME{value:<|"|>...<|"|>}<tool_response|>``)
and the model goes on writing right after them, with no new turn header.

Reasoning is a ``<|channel>thought\\n...<channel|>`` block before the reply.
The template keeps it only on tool-calling turns after the last user
message, and writes a newline before ``<channel|>`` that the model does not
write; a final answer's reasoning is dropped. Without ``enable_thinking``
the generation prompt holds an empty thought block that history never
shows. Both are train/serve drift that ``mtrl check template`` reports.

``template`` is the project's rendering of the published Gemma 4 template
(``google/gemma-4-31B-it``) for text conversations, token-identical to it on
the conversations ``tests/test_chat_formats_published.py`` renders with the
real template (kept in ``tests/data/templates/``).
"""

from __future__ import annotations

import re
from typing import Any, Collection

from .._toolparse import ParsedReply
from ._base import (
    FormatDefaults, ReasoningHistory, reply, split_reasoning, template_text, tool_call, vocab_has,
)

Q = '<|"|>'  # Gemma's string delimiter, one token

TEMPLATE = """{%- macro arg(value, escape_keys=true) -%}
  {%- if value is string -%}{{- '<|"|>' + value + '<|"|>' -}}
  {%- elif value is boolean -%}{{- 'true' if value else 'false' -}}
  {%- elif value is mapping -%}
    {{- '{' -}}
    {%- for key, item in value | dictsort -%}
      {{- ('<|"|>' + key + '<|"|>' if escape_keys else key) + ':' + arg(item, escape_keys) -}}{{- ',' if not loop.last -}}
    {%- endfor -%}
    {{- '}' -}}
  {%- elif value is sequence -%}
    {{- '[' -}}{%- for item in value -%}{{- arg(item, escape_keys) -}}{{- ',' if not loop.last -}}{%- endfor -%}{{- ']' -}}
  {%- else -%}{{- value -}}
  {%- endif -%}
{%- endmacro -%}
{%- macro names(items) -%}
  {{- '[' -}}{%- for item in items -%}{{- '<|"|>' + item + '<|"|>' -}}{{- ',' if not loop.last -}}{%- endfor -%}{{- ']' -}}
{%- endmacro -%}
{%- macro params(properties) -%}
  {#- property names that are schema words are left out, as the published template does -#}
  {%- set ns_p = namespace(first=true) -%}
  {%- for key, value in properties | dictsort if key not in ['description', 'type', 'properties', 'required', 'nullable'] -%}
    {%- set kind = value['type'] | upper -%}
    {%- set p = namespace(parts='') -%}
    {%- if value['description'] -%}{%- set p.parts = p.parts + ',description:<|"|>' + value['description'] + '<|"|>' -%}{%- endif -%}
    {%- if kind == 'STRING' and value['enum'] -%}{%- set p.parts = p.parts + ',enum:' + arg(value['enum']) -%}{%- endif -%}
    {%- if kind == 'ARRAY' and value['items'] is mapping and value['items'] -%}
      {%- set i = namespace(parts='') -%}
      {%- for ikey, ivalue in value['items'] | dictsort if ivalue is not none -%}
        {%- if ikey == 'properties' -%}
          {%- set i.parts = i.parts + ',properties:{' + (params(ivalue) if ivalue is mapping else '') + '}' -%}
        {%- elif ikey == 'required' -%}{%- set i.parts = i.parts + ',required:' + names(ivalue) -%}
        {%- elif ikey == 'type' -%}
          {%- set i.parts = i.parts + ',type:' + arg(ivalue | upper if ivalue is string else ivalue | map('upper') | list) -%}
        {%- else -%}{%- set i.parts = i.parts + ',' + ikey + ':' + arg(ivalue) -%}
        {%- endif -%}
      {%- endfor -%}
      {%- set p.parts = p.parts + ',items:{' + i.parts[1:] + '}' -%}
    {%- endif -%}
    {%- if value['nullable'] -%}{%- set p.parts = p.parts + ',nullable:true' -%}{%- endif -%}
    {%- if kind == 'OBJECT' -%}
      {%- set p.parts = p.parts + ',properties:{' + params(value['properties'] if value['properties'] is mapping else value) + '}' -%}
      {%- if value['required'] -%}{%- set p.parts = p.parts + ',required:' + names(value['required']) -%}{%- endif -%}
    {%- endif -%}
    {%- set p.parts = p.parts + ',type:<|"|>' + kind + '<|"|>' -%}
    {{- (',' if not ns_p.first else '') + key + ':{' + p.parts[1:] + '}' -}}{%- set ns_p.first = false -%}
  {%- endfor -%}
{%- endmacro -%}
{%- macro declaration(fn) -%}
  {{- 'declaration:' + fn['name'] + '{description:<|"|>' + (fn['description'] or '') + '<|"|>' -}}
  {%- set p = fn['parameters'] -%}
  {%- if p -%}
    {{- ',parameters:{' -}}
    {%- if p['properties'] -%}{{- 'properties:{' + params(p['properties']) + '},' -}}{%- endif -%}
    {%- if p['required'] -%}{{- 'required:' + names(p['required']) + ',' -}}{%- endif -%}
    {{- 'type:<|"|>' + (p['type'] or 'object') | upper + '<|"|>}' -}}
  {%- endif -%}
  {{- '}' -}}
{%- endmacro -%}
{%- macro visible(text) -%}
  {%- set kept = namespace(text='') -%}
  {%- for part in text.split('<channel|>') -%}{%- set kept.text = kept.text + part.split('<|channel>')[0] -%}{%- endfor -%}
  {{- kept.text | trim -}}
{%- endmacro -%}
{{- bos_token -}}
{%- set rest = messages -%}
{%- if enable_thinking or tools or (messages and messages[0]['role'] == 'system') -%}
  {{- '<|turn>system\\n' -}}
  {%- if enable_thinking -%}{{- '<|think|>\\n' -}}{%- endif -%}
  {%- if messages and messages[0]['role'] == 'system' -%}
    {{- messages[0]['content'] | trim -}}{%- set rest = messages[1:] -%}
  {%- endif -%}
  {%- for tool in tools or [] -%}{{- '<|tool>' + declaration(tool['function']) + '<tool|>' -}}{%- endfor -%}
  {{- '<turn|>\\n' -}}
{%- endif -%}
{%- set ns = namespace(last_user=-1, last=None, prev_role=None) -%}
{%- for message in rest -%}{%- if message['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- for message in rest -%}{%- if message['role'] != 'tool' -%}
  {%- set index = loop.index0 -%}
  {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
  {%- if not (role == 'model' and ns.prev_role == 'assistant') -%}{{- '<|turn>' + role + '\\n' -}}{%- endif -%}
  {%- set ns.prev_role = message['role'] -%}
  {%- set ns.last = None -%}
  {%- set calls = message['tool_calls'] or [] -%}
  {%- if message['reasoning_content'] and calls and index > ns.last_user -%}
    {{- '<|channel>thought\\n' + message['reasoning_content'] + '\\n<channel|>' -}}
  {%- endif -%}
  {%- for call in calls -%}
    {%- set fn = call['function'] -%}
    {{- '<|tool_call>call:' + fn['name'] + '{' -}}
    {%- if fn['arguments'] is mapping -%}
      {%- for key, value in fn['arguments'] | dictsort -%}{{- key + ':' + arg(value, false) -}}{{- ',' if not loop.last -}}{%- endfor -%}
    {%- elif fn['arguments'] is string -%}{{- fn['arguments'] -}}
    {%- endif -%}
    {{- '}<tool_call|>' -}}
    {%- set ns.last = 'tool_call' -%}
  {%- endfor -%}
  {%- set answered = namespace(any=false, open=true) -%}
  {%- if calls -%}
    {%- for follow in rest[index + 1:] -%}
      {%- if answered.open and follow['role'] == 'tool' -%}
        {%- set tool = namespace(name=follow['name'] or 'unknown') -%}
        {%- for call in calls -%}{%- if call['id'] == follow['tool_call_id'] -%}{%- set tool.name = call['function']['name'] -%}{%- endif -%}{%- endfor -%}
        {{- '<|tool_response>response:' + tool.name + '{value:' + arg(follow['content'], false) + '}<tool_response|>' -}}
        {%- set answered.any = true -%}{%- set ns.last = 'tool_response' -%}
      {%- else -%}{%- set answered.open = false -%}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
  {{- visible(message['content']) if role == 'model' else message['content'] | trim -}}
  {%- if ns.last == 'tool_call' and not answered.any -%}{{- '<|tool_response>' -}}
  {%- elif not (answered.any and not message['content']) -%}{{- '<turn|>\\n' -}}
  {%- endif -%}
{%- endif -%}{%- endfor -%}
{%- if add_generation_prompt and ns.last not in ['tool_response', 'tool_call'] -%}
  {{- '<|turn>model\\n' -}}
  {%- if not enable_thinking -%}{{- '<|channel>thought\\n<channel|>' -}}{%- endif -%}
{%- endif -%}"""

_CALL = re.compile(r"<\|tool_call>call:([^{<\s]+)\{(.*?)\}<tool_call\|>", re.S)
_TRAILING_STOPS = ("<|tool_response>", "<turn|>")


class Gemma4Format(FormatDefaults):
    name = "gemma4"
    template = TEMPLATE
    # a tool-calling turn's thought is kept after the last user message, an answer's is dropped
    reasoning_history = ReasoningHistory.DROPPED
    tool_call_opener = "<|tool_call>call:"
    name_end = "{"  # <|tool_call>call:<name>{<arguments>}<tool_call|>
    # "<|channel>" then the channel's name: held back until the name is written ("though" is not content)
    held_headers = (("<|channel>", "thought"),)
    stop_tokens = ("<turn|>", "<|tool_response>")
    # a call ends with <|tool_response>, which history writes right after the call, its result inside
    history_terminators = (("<|tool_response>", "<|tool_response>"),)
    vllm_tool_parser = "gemma4"  # vLLM's --tool-call-parser for this family

    def detect(self, tokenizer: Any) -> bool:
        return vocab_has(tokenizer, "<|turn>") or "<|tool_call>" in template_text(tokenizer)

    def parse(self, text: str, tool_names: Collection[str] | None = None, *, calls: bool = True) -> ParsedReply:
        for stop in _TRAILING_STOPS:  # a stop token the caller left on the text is not content
            text = text[: -len(stop)] if text.endswith(stop) else text
        reasoning, rest = split_reasoning(text, "<|channel>thought", "<channel|>")
        if not calls:
            return reply(rest, [], 0, reasoning, None)
        kept, found, malformed, pos, seen = [], [], 0, 0, 0
        for match in _CALL.finditer(rest):
            seen = match.end()
            arguments = _arguments("{" + match.group(2) + "}")
            if arguments is None:  # stays in the content as written
                malformed += 1
                continue
            kept.append(rest[pos : match.start()])
            found.append(tool_call(match.group(1), arguments))
            pos = match.end()
        if "<|tool_call>" in rest[seen:]:  # an unclosed (truncated) or unreadable call stays as text
            malformed += 1
        kept.append(rest[pos:])
        return reply("".join(kept), found, malformed, reasoning, tool_names)


class _Unreadable(ValueError):
    pass


def _arguments(text: str) -> dict[str, Any] | None:
    """The object Gemma's notation ``text`` writes (``{key:value,...}``), else None."""
    try:
        value, end = _value(text, 0)
    except _Unreadable:
        return None
    return value if isinstance(value, dict) and end == len(text) else None


_LITERALS = {"true": True, "false": False, "null": None, "None": None}
_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _value(text: str, at: int) -> tuple[Any, int]:
    """(value, position after it) of the Gemma-notation value at ``text[at]``."""
    if text.startswith(Q, at):
        end = text.find(Q, at + len(Q))
        if end < 0:
            raise _Unreadable("unclosed string")
        return text[at + len(Q) : end], end + len(Q)
    if text.startswith("{", at):
        out: dict[str, Any] = {}
        at += 1
        while not text.startswith("}", at):
            if out:
                at = _expect(text, at, ",")
            if text.startswith(Q, at):  # a quoted key
                key, at = _value(text, at)
            else:
                colon = text.find(":", at)
                key = text[at:colon] if colon > at else ""
                if not key or any(c in key for c in "{}[],<>\n\""):
                    raise _Unreadable("bad key")
                at = colon
            at = _expect(text, at, ":")
            out[key], at = _value(text, at)
        return out, at + 1
    if text.startswith("[", at):
        items: list[Any] = []
        at += 1
        while not text.startswith("]", at):
            if items:
                at = _expect(text, at, ",")
            item, at = _value(text, at)
            items.append(item)
        return items, at + 1
    for word, value in _LITERALS.items():
        if text.startswith(word, at):
            return value, at + len(word)
    number = _NUMBER.match(text, at)
    if number is None:
        raise _Unreadable(f"no value at {at}")
    raw = number.group(0)
    return (float(raw) if any(c in raw for c in ".eE") else int(raw)), number.end()


def _expect(text: str, at: int, char: str) -> int:
    if not text.startswith(char, at):
        raise _Unreadable(f"expected {char!r} at {at}")
    return at + 1


GEMMA4 = Gemma4Format()

__all__ = ["GEMMA4", "Gemma4Format"]
