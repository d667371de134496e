"""A streamed Bedrock ``converse-stream`` answer, written as its tokens are generated (the server's ``EventWriter``).

In AWS event-stream framing (``eventstream``), the events Bedrock sends:
``messageStart`` as soon as the first token is generated; a reasoning block
(``contentBlockDelta`` with ``reasoningContent.text``) and a text block
(``contentBlockDelta`` with ``text``) as their text is decoded, each closed by
``contentBlockStop`` when the next block begins. Text and reasoning blocks
have no ``contentBlockStart``: Bedrock's ``ContentBlockStart`` union holds
``toolUse`` (and server-side ``toolResult`` / ``image``) only, and botocore's
model says so. At the end each tool call is a ``toolUse`` block
(``contentBlockStart`` with its id and name, one ``contentBlockDelta`` whose
``toolUse.input`` is the call's arguments as a JSON string, as Bedrock
streams it, ``contentBlockStop``), then ``messageStop`` (the stop reason)
and ``metadata`` (usage and ``latencyMs``). The blocks equal
``_translate.content_blocks`` for the same result (a reply with
neither text nor calls gets its one empty text block).

A failure after the stream opened is an event-stream ``exception`` message
of one of the union's exception members (``modelStreamErrorException`` for
an engine failure), which botocore raises as ``EventStreamError``.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import orjson

from ...chat import TextDelta
from ...errors import MtrlError
from ...types import ChatResult
from . import eventstream
from ._maps import STREAM_EXCEPTIONS
from ._translate import usage


class ConverseEvents:
    """Bedrock's events of one streamed Converse answer (see the module docstring).

    ``stop_reason(result)`` is Bedrock's stop reason for the finished reply;
    ``started`` the call's start (``time.perf_counter()``), for ``metadata.metrics.latencyMs``.
    """

    content_type = eventstream.CONTENT_TYPE

    def __init__(self, stop_reason: Callable[[ChatResult], str], started: float) -> None:
        self.stop_reason = stop_reason
        self.started = started
        self.index = -1
        self.open: str | None = None  # the block being written: "reasoningContent", "text" or None
        self.opened = False  # some text or reasoning block was written

    def opening(self, prompt_tokens: int) -> bytes:
        return eventstream.event("messageStart", b'{"role":"assistant"}')

    def text(self, delta: TextDelta) -> bytes:
        out = b""
        if delta.reasoning:
            out += self._delta("reasoningContent", {"reasoningContent": {"text": delta.reasoning}})
        if delta.content:
            out += self._delta("text", {"text": delta.content})
        return out

    def closing(self, result: ChatResult) -> bytes:
        calls = result.message.get("tool_calls") or ()
        out = b""
        if not self.opened and not calls:  # the one empty text block of an empty reply
            out += self._delta("text", {"text": ""})
        out += self._close()
        for call in calls:
            function = call["function"]
            self.index += 1
            start = {"toolUse": {"toolUseId": call["id"], "name": function["name"]}}
            out += _event("contentBlockStart", start=start, contentBlockIndex=self.index)
            delta = {"toolUse": {"input": function["arguments"] or "{}"}}  # the call's JSON text, as generated
            out += _event("contentBlockDelta", delta=delta, contentBlockIndex=self.index)
            out += _event("contentBlockStop", contentBlockIndex=self.index)
        out += _event("messageStop", stopReason=self.stop_reason(result))
        latency_ms = int((time.perf_counter() - self.started) * 1000)
        return out + _event("metadata", usage=usage(result), metrics={"latencyMs": latency_ms})

    def error(self, exc: MtrlError) -> bytes:
        kind = STREAM_EXCEPTIONS.get(exc.status, "internalServerException")
        return eventstream.exception(kind, orjson.dumps({"message": exc.message}))

    def _delta(self, kind: str, delta: dict[str, Any]) -> bytes:
        """A delta of a ``kind`` block, opening it (and closing the one before) unless it is being written."""
        out = b""
        if self.open != kind:
            out += self._close()
            self.index += 1
            self.open = kind
            self.opened = True
        return out + _event("contentBlockDelta", delta=delta, contentBlockIndex=self.index)

    def _close(self) -> bytes:
        if self.open is None:
            return b""
        self.open = None
        return _event("contentBlockStop", contentBlockIndex=self.index)


def _event(kind: str, **fields: Any) -> bytes:
    return eventstream.event(kind, orjson.dumps(fields))


__all__ = ["ConverseEvents"]
