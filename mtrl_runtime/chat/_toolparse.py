"""Parsing of ``<tool_call>{json}</tool_call>`` blocks in a completion into OpenAI tool calls.

A block is well formed when its body is a JSON object with a non-empty string
``name`` and an object ``arguments`` (a missing ``arguments`` means ``{}``).
Anything else (bad JSON, no name, arguments that are not an object, an
unclosed tag) stays in the content as the text the model wrote and is
counted in ``malformed``; parsing never raises, because a malformed call is
a training signal, not a server error.

A call to a name that is not among the request's tools is still returned as
a tool call: the agent framework answers it with an "unknown tool" result,
which the model learns from. ``unknown_tools`` counts them when names are given.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any, Collection

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"


@dataclass(frozen=True)
class ParsedReply:
    """A completion split into its text content and its OpenAI ``tool_calls``."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    malformed: int = 0
    unknown_tools: int = 0
    reasoning: str | None = None  # the model's reasoning text (``reasoning_content``), when its format has one

    def to_message(self) -> dict[str, Any]:
        """The OpenAI assistant message (``tool_calls`` and ``reasoning_content`` only when there are some)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


def parse_tool_calls(text: str, tool_names: Collection[str] | None = None) -> ParsedReply:
    """Split ``text`` into content and tool calls; see the module docstring for what counts as malformed."""
    kept: list[str] = []  # text outside well-formed blocks, in order
    calls: list[dict[str, Any]] = []
    malformed = 0
    pos = 0
    while (start := text.find(OPEN_TAG, pos)) >= 0:
        body_start = start + len(OPEN_TAG)
        end = text.find(CLOSE_TAG, body_start)
        next_open = text.find(OPEN_TAG, body_start)
        if end < 0 or 0 <= next_open < end:  # unclosed: keep it as text up to the next block (or the end)
            stop = next_open if next_open >= 0 else len(text)
            kept.append(text[pos:stop])
            malformed += 1
            pos = stop
            continue
        call = _parse_block(text[body_start:end])
        if call is None:
            kept.append(text[pos : end + len(CLOSE_TAG)])
            malformed += 1
        else:
            kept.append(text[pos:start])
            calls.append(call)
        pos = end + len(CLOSE_TAG)
    kept.append(text[pos:])
    content = "".join(kept).strip()
    unknown = 0 if tool_names is None else sum(c["function"]["name"] not in tool_names for c in calls)
    return ParsedReply(content=content or None, tool_calls=calls, malformed=malformed, unknown_tools=unknown)


def _parse_block(body: str) -> dict[str, Any] | None:
    """The OpenAI tool call a block's body describes, or None if it is malformed."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    name, arguments = data.get("name"), data.get("arguments", {})
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    return {
        "id": "call_" + secrets.token_hex(12),
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


__all__ = ["CLOSE_TAG", "OPEN_TAG", "ParsedReply", "parse_tool_calls"]
