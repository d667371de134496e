"""``harmony``: gpt-oss — messages in channels (``analysis``, ``commentary``, ``final``), calls addressed ``to=functions.NAME``.

A completion (after ``<|start|>assistant``) is a run of messages, each
``<|channel|>CHANNEL[ to=functions.NAME][ <|constrain|>json]<|message|>BODY``
(the recipient may also come first: `` to=functions.NAME<|channel|>...``)
closed by ``<|end|>`` (more follows, after ``<|start|>assistant``), ``<|call|>``
(a tool call; the turn waits for its result) or ``<|return|>`` (done).
``analysis`` is reasoning; ``final`` is the content; ``commentary`` addressed
to a function is a call, unaddressed it is a preamble shown as content.
Earlier turns' analysis is dropped from history, as the harmony spec says.

The template renders exactly what deployment renders: openai-harmony's
rendering (tests/test_chat_harmony_reference.py compares token ids), with
history calls as vLLM passes them to openai-harmony
(``<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>``,
not the order the model writes them in: drift under ``history_training:
extend``, a new segment under ``deployed``) and tools as openai-harmony's
TypeScript declarations (``namespace functions { type NAME = (_: {...}) => any; }``).
History keeps a call's ``<|call|>`` and writes a final answer's
``<|return|>`` as ``<|end|>`` (``history_terminators``): a turn extends
after either with the new messages' ids alone.
"""

from __future__ import annotations

import json
import re
from typing import Any, Collection

from .._template_pieces import split_system
from .._toolparse import ParsedReply
from ._base import FormatDefaults, ReasoningHistory, call_from_json, reply, template_text, vocab_has

# The tool schemas become the TypeScript-like declarations openai-harmony writes (its encoding.rs,
# json_schema_to_typescript, rule for rule: oneOf unions, nullable, enums, titles, descriptions, examples,
# defaults as trailing comments); gpt-oss's own hub template renders the same form.
_SCHEMA_MACROS = r"""
{#- a key is tested with `in` before it is read: a missing key costs the sandbox a failed lookup -#}
{%- macro harmony_default(value, owner, raw_enum) -%}
  {%- set is_enum = 'enum' in owner and owner['enum'] is iterable and owner['enum'] is not string
                    and owner['enum'] is not mapping and owner['enum'] | length > 0 -%}
  {%- if value is string and not is_enum -%}{{- '"' + value + '"' -}}
  {%- elif value is string and raw_enum -%}{{- value -}}
  {%- else -%}{{- value | tojson(separators=(',', ':')) -}}
  {%- endif -%}
{%- endmacro -%}
{%- macro harmony_note(v, skip_description, about, raw_enum) -%}
  {%- set note = v['description'] if 'description' in v and v['description'] is string and not skip_description
                 and v['description'] != about else none -%}
  {%- set dflt = ('default: ' + harmony_default(v['default'], v, raw_enum)) if 'default' in v else none -%}
  {%- if note is not none or dflt is not none -%}{{- ' // ' + ([note, dflt] | reject('none') | join(' ')) -}}{%- endif -%}
{%- endmacro -%}
{%- macro harmony_ts(schema, indent) -%}
  {%- set s = schema if schema is mapping else {} -%}
  {%- set t = s['type'] if 'type' in s else none -%}
  {%- if 'oneOf' in s and s['oneOf'] is iterable and s['oneOf'] is not string and s['oneOf'] is not mapping -%}
    {%- for variant in s['oneOf'] -%}
      {%- set v = variant if variant is mapping else {} -%}
      {%- set text = harmony_ts(variant, indent + '   ') -%}
      {{- '\n' + indent + ' | ' + text -}}
      {{- ' | null' if 'nullable' in v and v['nullable'] is sameas true and 'null' not in text else '' -}}
      {{- harmony_note(v, false, none, false) -}}
    {%- endfor -%}
  {%- elif t is iterable and t is not string and t is not mapping and (t | select('string') | list) -%}
    {%- for name in t | select('string') -%}{{- (' | ' if not loop.first else '') + ('number' if name == 'integer' else name) -}}{%- endfor -%}
  {%- elif t == 'object' -%}
    {%- if 'description' in s and s['description'] is string -%}{{- indent + '// ' + s['description'] + '\n' -}}{%- endif -%}
    {{- '{\n' -}}
    {%- if 'properties' in s and s['properties'] is mapping -%}
      {%- set required = s['required'] if 'required' in s and s['required'] is iterable and s['required'] is not string
                         and s['required'] is not mapping else [] -%}
      {%- set props = s['properties'] -%}
      {%- for key in props -%}
        {%- set p = props[key] -%}
        {%- set mark = '' if key in required else '?' -%}
        {%- if p is not mapping -%}{{- indent + key + mark + ': any,\n' -}}
        {%- else -%}
          {%- if 'title' in p and p['title'] is string -%}{{- indent + '// ' + p['title'] + '\n' + indent + '//\n' -}}{%- endif -%}
          {%- if 'oneOf' not in p and 'description' in p and p['description'] is string -%}
            {{- indent + '// ' + p['description'] + '\n' -}}
          {%- endif -%}
          {%- if 'examples' in p and p['examples'] is iterable and p['examples'] is not string and p['examples'] is not mapping
                 and p['examples'] | length > 0 -%}
            {{- indent + '// Examples:\n' -}}
            {%- for example in p['examples'] if example is string -%}{{- indent + '// - "' + example + '"\n' -}}{%- endfor -%}
          {%- endif -%}
          {%- if 'oneOf' in p and p['oneOf'] is iterable and p['oneOf'] is not string and p['oneOf'] is not mapping -%}
            {%- set variants = p['oneOf'] -%}
            {%- set about = p['description'] if 'description' in p and p['description'] is string else none -%}
            {%- set first = variants[0] if variants | length > 0 else none -%}
            {%- set above = about is not none and not (first is mapping and 'description' in first
                                                       and first['description'] is string and first['description'] == about) -%}
            {%- if above -%}{{- indent + '// ' + about + '\n' -}}{%- endif -%}
            {%- if 'default' in p -%}{{- indent + '// default: ' + harmony_default(p['default'], p, true) + '\n' -}}{%- endif -%}
            {{- indent + key + mark + ':\n' -}}
            {%- for variant in variants -%}
              {%- set v = variant if variant is mapping else {} -%}
              {%- set text = harmony_ts(variant, indent + '   ') -%}
              {{- indent + ' | ' + text -}}
              {{- ' | null' if 'nullable' in v and v['nullable'] is sameas true and 'null' not in text else '' -}}
              {{- harmony_note(v, loop.first and above, about, true) + '\n' -}}
            {%- endfor -%}
            {{- indent + ',\n' -}}
          {%- else -%}
            {#- the scalar types inline: a macro call is the render's main cost -#}
            {%- set pt = p['type'] if 'type' in p else none -%}
            {%- if pt == 'number' or pt == 'integer' -%}{%- set text = 'number' -%}
            {%- elif pt == 'boolean' -%}{%- set text = 'boolean' -%}
            {%- elif pt == 'string' and 'enum' not in p -%}{%- set text = 'string' -%}
            {%- else -%}{%- set text = harmony_ts(p, indent + '    ') -%}
            {%- endif -%}
            {{- indent + key + mark + ': ' + text -}}
            {{- ' | null' if 'nullable' in p and p['nullable'] is sameas true and 'null' not in text else '' -}}
            {{- ',' + (' // default: ' + harmony_default(p['default'], p, true) if 'oneOf' not in p and 'default' in p else '') -}}
            {{- '\n' -}}
          {%- endif -%}
        {%- endif -%}
      {%- endfor -%}
    {%- endif -%}
    {{- indent + '}' -}}
  {%- elif t == 'string' -%}
    {%- set values = s['enum'] | select('string') | list if 'enum' in s and s['enum'] is iterable and s['enum'] is not string
                     and s['enum'] is not mapping else [] -%}
    {%- if values -%}{%- for value in values -%}{{- (' | ' if not loop.first else '') + '"' + value + '"' -}}{%- endfor -%}
    {%- else -%}string{%- endif -%}
  {%- elif t == 'number' or t == 'integer' -%}number
  {%- elif t == 'boolean' -%}boolean
  {%- elif t == 'array' -%}
    {%- if 'items' in s -%}{{- harmony_ts(s['items'], indent) + '[]' -}}{%- else -%}Array<any>{%- endif -%}
  {%- else -%}any
  {%- endif -%}
{%- endmacro -%}
"""

TEMPLATE = _SCHEMA_MACROS + "\n" + split_system() + r"""{{- '<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\n\n' -}}
{{- 'Reasoning: ' + (reasoning_effort if reasoning_effort is defined else 'medium') + '\n\n' -}}
{{- '# Valid channels: analysis, commentary, final. Channel must be included for every message.' -}}
{%- if tools -%}{{- "\nCalls to these tools must go to the commentary channel: 'functions'." -}}{%- endif -%}
{{- '<|end|>' -}}
{%- if system_text or tools -%}
  {{- '<|start|>developer<|message|>' -}}
  {%- if system_text -%}{{- '# Instructions\n\n' + system_text -}}{%- endif -%}
  {%- if tools -%}
    {%- if system_text -%}{{- '\n\n' -}}{%- endif -%}
    {{- '# Tools\n\n## functions\n\nnamespace functions {\n\n' -}}
    {%- for tool in tools -%}
      {%- set fn = tool['function'] -%}
      {%- set about = fn['description'] if 'description' in fn and fn['description'] is string else '' -%}
      {%- if '\n' in about -%}
        {#- one comment per line of the description, as Rust's str::lines() splits it -#}
        {%- set about = about.replace('\r\n', '\n') -%}
        {%- for line in (about[:-1] if about[-1:] == '\n' else about).split('\n') -%}{{- '// ' + line + '\n' -}}{%- endfor -%}
      {%- elif about -%}{{- '// ' + about + '\n' -}}
      {%- endif -%}
      {%- if 'parameters' in fn -%}{{- 'type ' + fn['name'] + ' = (_: ' + harmony_ts(fn['parameters'], '') + ') => any;\n\n' -}}
      {%- else -%}{{- 'type ' + fn['name'] + ' = () => any;\n\n' -}}
      {%- endif -%}
    {%- endfor -%}
    {{- '} // namespace functions' -}}
  {%- endif -%}
  {{- '<|end|>' -}}
{%- endif -%}
{%- for message in rest -%}
  {%- if message['role'] == 'user' -%}
    {{- '<|start|>user<|message|>' + message['content'] + '<|end|>' -}}
  {%- elif message['role'] == 'tool' -%}
    {{- '<|start|>functions.' + (message['name'] or 'tool') + ' to=assistant<|channel|>commentary<|message|>' -}}
    {{- message['content'] + '<|end|>' -}}
  {%- elif message['role'] == 'assistant' -%}
    {%- if message['reasoning_content'] and not (rest[loop.index0 + 1:] | selectattr('role', 'equalto', 'user') | first) -%}
      {{- '<|start|>assistant<|channel|>analysis<|message|>' + message['reasoning_content'] + '<|end|>' -}}
    {%- endif -%}
    {%- if message['tool_calls'] -%}
      {%- for call in message['tool_calls'] -%}
        {%- set fn = call['function'] -%}
        {#- history as vLLM hands it to openai-harmony: the recipient before the channel, content type json -#}
        {{- '<|start|>assistant to=functions.' + fn['name'] + '<|channel|>commentary json<|message|>' -}}
        {{- (fn['arguments'] if fn['arguments'] is string else (fn['arguments'] | tojson)) + '<|call|>' -}}
      {%- endfor -%}
    {%- else -%}
      {{- '<|start|>assistant<|channel|>final<|message|>' + (message['content'] or '') + '<|end|>' -}}
    {%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}"""

_MESSAGE_END = re.compile(r"<\|end\|>|<\|call\|>|<\|return\|>")
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")


class HarmonyFormat(FormatDefaults):
    name = "harmony"
    template = TEMPLATE
    reasoning_history = ReasoningHistory.DROPPED
    tool_call_opener = "<|channel|>commentary to=functions."
    name_end = " <|constrain|>json<|message|>"
    # a call whose recipient comes before its channel (openai-harmony's order, as the history shows calls) opens
    # with " to=functions." (the first message) or "<|start|>assistant to=functions."
    call_openers = (tool_call_opener, " to=functions.")
    # a message header (``<|start|>assistant<|channel|>final<|message|>``) is never text: held until it closes
    held_headers = (("<|start|>", "<|message|>"), ("<|channel|>", "<|message|>"))
    stop_tokens = ("<|call|>", "<|return|>")
    # openai-harmony renders a past call ending <|call|> as generated, a past final answer ending <|end|>, not the
    # <|return|> the model wrote: extension keeps the generated token (a rewrite there is drift, not glue)
    history_terminators = (("<|call|>", "<|call|>"), ("<|return|>", "<|end|>"))
    vllm_tool_parser = "openai"  # vLLM's --tool-call-parser for this family

    def detect(self, tokenizer: Any) -> bool:
        return vocab_has(tokenizer, "<|channel|>") or "<|channel|>" in template_text(tokenizer)

    def parse(self, text: str, tool_names: Collection[str] | None = None, *, calls: bool = True) -> ParsedReply:
        reasoning: list[str] = []
        content: list[str] = []
        found: list[dict[str, Any]] = []
        malformed = 0
        for header, body in _messages(text):
            channel = _channel(header)
            recipient = _RECIPIENT.search(header or "")
            if header is None or (not channel and recipient is None):  # text outside any message header
                content.append(body)
            elif recipient is not None and calls:
                # the closing <|call|> is an eos the caller may have stripped: the body's JSON decides
                call = _call(recipient.group(1), body)
                if call is None:
                    malformed += 1
                    content.append(header + "<|message|>" + body)
                else:
                    found.append(call)
            elif channel == "analysis":
                reasoning.append(body)
            else:  # final, or an unaddressed commentary preamble
                content.append(body)
        if not calls:
            return ParsedReply(content="".join(content).strip() or None, reasoning="\n".join(reasoning).strip() or None)
        return reply("".join(content), found, malformed, "\n".join(reasoning), tool_names)


def _channel(header: str | None) -> str:
    if header is None or "<|channel|>" not in header:
        return ""
    words = header.split("<|channel|>", 1)[1].split()
    return words[0] if words else ""


def _messages(text: str) -> list[tuple[str | None, str]]:
    """(header, body) of each message in a completion; a header of None is bare text."""
    out: list[tuple[str | None, str]] = []
    pos = 0
    while pos < len(text):
        if text.startswith("<|start|>", pos):
            pos += len("<|start|>")
        start = text.find("<|message|>", pos)
        if start < 0:
            rest = text[pos:]
            if rest.strip():
                out.append((None, rest) if "<|channel|>" not in rest else (rest, ""))
            break
        header = text[pos:start]
        end = _MESSAGE_END.search(text, start)
        body_end = end.start() if end else len(text)
        out.append((header, text[start + len("<|message|>") : body_end]))
        pos = end.end() if end else len(text)
    return out


def _call(name: str, body: str) -> dict[str, Any] | None:
    try:
        arguments = json.loads(body)
    except ValueError:
        return None
    return call_from_json({"name": name, "arguments": arguments})


HARMONY = HarmonyFormat()

__all__ = ["HARMONY", "HarmonyFormat"]
