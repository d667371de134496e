"""``harmony``: gpt-oss — messages in channels (``analysis``, ``commentary``, ``final``), calls addressed ``to=functions.NAME``.

A completion (after ``<|start|>assistant``) is a run of messages, each
``<|channel|>CHANNEL[ to=functions.NAME][ <|constrain|>json]<|message|>BODY``
closed by ``<|end|>`` (more follows, after ``<|start|>assistant``), ``<|call|>``
(a tool call; the turn waits for its result) or ``<|return|>`` (done).
``analysis`` is reasoning; ``final`` is the content; ``commentary`` addressed
to a function is a call, unaddressed it is a preamble shown as content.
Earlier turns' analysis is dropped from history, as the harmony spec says.
The template lists tools as JSON schemas in the developer message (the spec
writes them as TypeScript; the model reads either, the tokens differ).
"""

from __future__ import annotations

import json
import re
from typing import Any, Collection

from .._toolparse import ParsedReply
from ._base import ReasoningHistory, call_from_json, reply, template_text, vocab_has

TEMPLATE = """{%- if messages and messages[0]['role'] == 'system' -%}
  {%- set system_text = messages[0]['content'] -%}{%- set rest = messages[1:] -%}
{%- else -%}
  {%- set system_text = '' -%}{%- set rest = messages -%}
{%- endif -%}
{{- '<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\\n' -}}
{{- 'Reasoning: ' + (reasoning_effort if reasoning_effort is defined else 'medium') + '\\n\\n' -}}
{{- '# Valid channels: analysis, commentary, final. Channel must be included for every message.' -}}
{%- if tools -%}{{- \"\\nCalls to these tools must go to the commentary channel: 'functions'.\" -}}{%- endif -%}
{{- '<|end|>' -}}
{%- if system_text or tools -%}
  {{- '<|start|>developer<|message|>' -}}
  {%- if system_text -%}{{- '# Instructions\\n\\n' + system_text -}}{%- endif -%}
  {%- if tools -%}
    {%- if system_text -%}{{- '\\n\\n' -}}{%- endif -%}
    {{- '# Tools\\n\\n## functions\\n\\nnamespace functions {' -}}
    {%- for tool in tools -%}{{- '\\n\\n' + (tool['function'] | tojson) -}}{%- endfor -%}
    {{- '\\n\\n} // namespace functions' -}}
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
        {{- '<|start|>assistant<|channel|>commentary to=functions.' + fn['name'] + ' <|constrain|>json<|message|>' -}}
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


class HarmonyFormat:
    name = "harmony"
    template = TEMPLATE
    reasoning_history = ReasoningHistory.DROPPED
    tool_call_opener = "<|channel|>commentary to=functions."
    stop_tokens = ("<|call|>", "<|return|>")
    vllm_tool_parser = "openai"  # vLLM's --tool-call-parser for this family

    def detect(self, tokenizer: Any) -> bool:
        return vocab_has(tokenizer, "<|channel|>") or "<|channel|>" in template_text(tokenizer)

    def forced_prefix(self, tool_name: str | None) -> str:
        if tool_name is None:
            return self.tool_call_opener
        return f"{self.tool_call_opener}{tool_name} <|constrain|>json<|message|>"

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
