"""What a reference endpoint's wire protocol provides: the request it takes, the reply it gives, its credential.

``_reference`` sends an evaluation's reference-side calls through one of
these (its ``WIRES``, by ``ReferenceModel.protocol``): the conversation arrives
as normalized OpenAI chat messages (tool-call arguments parsed), whatever
protocol the agent spoke, and leaves in the reference's own shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Protocol

from ..types import ChatOptions, SamplingParams


@dataclass(frozen=True)
class ReferenceReply:
    """One answer of the reference endpoint, as the OpenAI assistant message sent back to the agent."""

    message: dict[str, Any]
    finish_reason: str
    completion_text: str
    reasoning: str | None


class ReferenceWire(Protocol):
    """One protocol a reference endpoint speaks; ``base`` is ``ReferenceModel.url`` without its trailing slash."""

    def chat_url(self, base: str, model: str) -> str: ...

    def models_url(self, base: str) -> str | None:
        """What the check reads (its model list); None: the check only connects to ``base``."""
        ...

    def headers(self, api_key: str | None, method: str, url: str, content: bytes) -> dict[str, str]:
        """The request's credential headers (a signature may cover the URL and the body)."""
        ...

    def request_body(self, model: str, messages: list[dict[str, Any]], tools: list[Mapping[str, Any]],
                     sampling: SamplingParams, options: ChatOptions) -> dict[str, Any]: ...

    def parse_reply(self, payload: Any) -> ReferenceReply:
        """The reply; ValueError naming what is missing."""
        ...


def arguments_text(arguments: Any) -> str:
    """Tool-call arguments as the JSON text OpenAI's wire carries."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def arguments_object(arguments: Any) -> Any:
    """Tool-call arguments as a JSON value (parsed when they are JSON text)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments else {}
        except ValueError:
            return arguments
    return arguments


def tool_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """An OpenAI tool call from a block of another wire (its arguments as JSON text)."""
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments or {}, ensure_ascii=False)}}


def assistant_reply(texts: list[str], thoughts: list[str], calls: list[dict[str, Any]], stop: Any,
                    finish: Mapping[str, str]) -> ReferenceReply:
    """The OpenAI assistant message of a reply read as text, reasoning and tool-call blocks; ``stop`` mapped by ``finish``."""
    content = "".join(texts)
    reasoning = "\n".join(thoughts) or None
    message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    reason = finish.get(stop, "tool_calls" if calls else "stop") if isinstance(stop, str) else "stop"
    return ReferenceReply(message, reason, content, reasoning)


def append_blocks(turns: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    """Add ``blocks`` as a ``role`` message, joining the previous one when it has the same role."""
    if not blocks:
        return
    if turns and turns[-1]["role"] == role:
        turns[-1]["content"].extend(blocks)
    else:
        turns.append({"role": role, "content": list(blocks)})


__all__ = ["ReferenceReply", "ReferenceWire", "append_blocks", "arguments_object", "arguments_text", "assistant_reply",
           "tool_call"]
