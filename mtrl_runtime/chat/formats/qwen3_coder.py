"""``qwen3_coder``: Qwen3-Coder's XML calls — ``<tool_call><function=NAME><parameter=KEY>value</parameter></function></tool_call>``.

Each parameter's value is the text between its tags (one newline trimmed
each side); a value that reads as JSON other than a bare string (numbers,
booleans, objects, lists) is decoded, anything else is kept as a string, as
Qwen3-Coder's documented parser does. Reasoning, when present, is a
``<think>`` block. The template is ChatML with the calls in XML.
"""

from __future__ import annotations

import json
import re
from typing import Any, Collection

from .._template_pieces import CHATML_OTHER_ROLES, CHATML_TURNS_TO_CALLS, TOOLS_AS_JSON_LINES, XML_CALL, split_system
from .._toolparse import ParsedReply
from ._base import FormatDefaults, ReasoningHistory, reply, split_reasoning, template_text, tool_call

TEMPLATE = (
    split_system("You are Qwen, a helpful assistant.")
    + """{{- '<|im_start|>system\\n' + system_text -}}
{%- if tools -%}
  {{- '\\n\\n# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>' -}}
  """ + TOOLS_AS_JSON_LINES + """
  {{- '\\n</tools>\\n\\nIf you choose to call a function ONLY reply in the following format with NO suffix:\\n\\n' -}}
  {{- '<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>\\nvalue_1\\n</parameter>\\n</function>\\n</tool_call>' -}}
{%- endif -%}
{{- '<|im_end|>\\n' -}}
""" + CHATML_TURNS_TO_CALLS + """\
      {%- set fn = call['function'] -%}
      {%- if message['content'] or not loop.first -%}{{- '\\n' -}}{%- endif -%}
""" + XML_CALL + """\
    {%- endfor -%}
    {{- '<|im_end|>\\n' -}}
""" + CHATML_OTHER_ROLES + """\
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"""
)

_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_FUNCTION = re.compile(r"\A\s*<function=([^>\n]+)>(.*)</function>\s*\Z", re.S)
_PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


class Qwen3CoderFormat(FormatDefaults):
    name = "qwen3_coder"
    template = TEMPLATE
    reasoning_history = ReasoningHistory.DROPPED
    tool_call_opener = "<tool_call>\n<function="
    name_end = ">\n"
    vllm_tool_parser = "qwen3_coder"  # vLLM's --tool-call-parser for this family

    def detect(self, tokenizer: Any) -> bool:
        return "<function=" in template_text(tokenizer)

    def parse(self, text: str, tool_names: Collection[str] | None = None, *, calls: bool = True) -> ParsedReply:
        reasoning, rest = split_reasoning(text)
        if not calls:
            return reply(rest, [], 0, reasoning, None)
        kept, found, malformed, pos, seen = [], [], 0, 0, 0
        for block in _BLOCK.finditer(rest):
            seen = block.end()
            call = _parse_function(block.group(1))
            if call is None:  # stays in the content as written
                malformed += 1
                continue
            kept.append(rest[pos : block.start()])
            found.append(call)
            pos = block.end()
        if "<tool_call>" in rest[seen:]:  # an unclosed (truncated) call stays as text
            malformed += 1
        kept.append(rest[pos:])
        return reply("".join(kept), found, malformed, reasoning, tool_names)


def _parse_function(body: str) -> dict[str, Any] | None:
    match = _FUNCTION.match(body)
    if match is None:
        return None
    name, inner = match.group(1).strip(), match.group(2)
    if not name or _PARAM.sub("", inner).strip():  # stray text between parameters: not a call we can read
        return None
    return tool_call(name, {key.strip(): _value(raw) for key, raw in _PARAM.findall(inner)})


# the first characters a JSON value other than a string can start with (NaN and Infinity: Python's json reads them)
_JSON_STARTS = frozenset('{[-0123456789tfnNI')


def _value(raw: str) -> Any:
    raw = raw[1:] if raw.startswith("\n") else raw
    raw = raw[:-1] if raw.endswith("\n") else raw
    if raw.lstrip()[:1] not in _JSON_STARTS:  # plain text (or a JSON string, kept as written): no parse to fail
        return raw
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    return raw if isinstance(value, str) else value


QWEN3_CODER = Qwen3CoderFormat()

__all__ = ["QWEN3_CODER", "Qwen3CoderFormat"]
