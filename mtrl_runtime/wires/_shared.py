"""What every wire protocol shares: the reply of a called endpoint, finish-reason tables, tool results, tool calls."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReferenceReply:
    """One answer of a called endpoint, as the OpenAI assistant message sent back to the agent."""

    message: dict[str, Any]
    finish_reason: str
    completion_text: str
    reasoning: str | None


@dataclass(frozen=True)
class Wire:
    """One wire protocol: its request schema, how to call a real endpoint of it, the name a reference takes for it."""

    name: str
    request: Any
    calling: Any = None
    reference_name: str | None = None


class FinishReasons:
    """A protocol's stop reasons and the chat finish reasons they mean, written once for both directions.

    ``pairs`` are ``(native, chat)``. Reading a reply, each native reason is
    its chat reason (an unknown one: ``tool_calls`` when the reply holds
    calls, else ``stop``; a missing one: ``stop``). Writing an answer, a chat
    reason is the first native reason paired with it (an unknown one:
    ``default``).
    """

    def __init__(self, pairs: tuple[tuple[str, str], ...], default: str) -> None:
        self.pairs = pairs
        self.default = default
        self._chat = dict(pairs)
        self._native: dict[str, str] = {}
        for native, chat in pairs:
            self._native.setdefault(chat, native)

    def to_chat(self, native: Any, has_calls: bool = False) -> str:
        if not isinstance(native, str):
            return "stop"
        return self._chat.get(native, "tool_calls" if has_calls else "stop")

    def to_native(self, chat: str) -> str:
        return self._native.get(chat, self.default)


def tool_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """An OpenAI tool call from a block of another wire (its arguments as JSON text)."""
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments or {}, ensure_ascii=False)}}


def arguments_object(arguments: Any) -> Any:
    """Tool-call arguments as a JSON value (parsed when they are JSON text)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments else {}
        except ValueError:
            return arguments
    return arguments


def assistant_reply(texts: list[str], thoughts: list[str], calls: list[dict[str, Any]], stop: Any,
                    finish: "FinishReasons") -> ReferenceReply:
    """The OpenAI assistant message of a reply read as text, reasoning and tool-call blocks; ``stop`` read by ``finish``."""
    content = "".join(texts)
    reasoning = "\n".join(thoughts) or None
    message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return ReferenceReply(message, finish.to_chat(stop, bool(calls)), content, reasoning)


def tool_message(call_id: str, text: str, failed: bool, name: str | None = None) -> dict[str, Any]:
    """The chat ``tool`` message of one tool result: ``text`` unchanged, ``status: error`` when ``failed``."""
    message: dict[str, Any] = {"role": "tool", "tool_call_id": call_id, "content": text}
    if name is not None:
        message["name"] = name
    if failed:
        message["status"] = "error"
    return message


__all__ = ["FinishReasons", "ReferenceReply", "Wire", "arguments_object", "assistant_reply", "tool_call", "tool_message"]
