"""A streamed Anthropic Messages answer, written as its tokens are generated (the server's ``EventWriter``).

``message_start`` as soon as the call is accepted; a ``thinking`` block
(``thinking_delta``s, closed by the ``signature_delta`` of the fixed marker)
and a ``text`` block (``text_delta``s) opened as their first text is
decoded; at the end the ``tool_use`` blocks (each input as one
``input_json_delta``), ``message_delta`` (stop reason, stop sequence, usage)
and ``message_stop``. The blocks are those of ``message_object`` for the
same result (a reply with neither text nor calls still gets its empty
``text`` block).
"""

from __future__ import annotations

from typing import Any, Callable

import orjson

from ...chat import TextDelta
from ...errors import MtrlError
from ...types import ChatResult
from .._shared import EVENTS, sse
from ._response import SIGNATURE, anthropic_error_body


class MessagesEvents:
    """Anthropic's events of one streamed message (see the module docstring).

    ``finish(result)`` builds the final ``message`` object (ids, stop sequence and usage as a non-streamed answer has them).
    """

    content_type = EVENTS

    def __init__(self, message_id: str, model: str, finish: Callable[[ChatResult], dict[str, Any]]) -> None:
        self.message_id = message_id
        self.model = model
        self.finish = finish
        self.index = -1
        self.open: str | None = None  # the block being written: "thinking", "text" or None
        self.text_opened = False

    def opening(self, prompt_tokens: int) -> bytes:
        usage = {"input_tokens": prompt_tokens, "output_tokens": 0, "cache_creation_input_tokens": 0,
                 "cache_read_input_tokens": 0}
        message = {"id": self.message_id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                   "stop_reason": None, "stop_sequence": None, "usage": usage}
        return _event("message_start", message=message)

    def text(self, delta: TextDelta) -> bytes:
        out = b""
        if delta.reasoning:
            out += self._block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out += _event("content_block_delta", index=self.index,
                          delta={"type": "thinking_delta", "thinking": delta.reasoning})
        if delta.content:
            out += self._block("text", {"type": "text", "text": ""})
            out += _event("content_block_delta", index=self.index, delta={"type": "text_delta", "text": delta.content})
        return out

    def closing(self, result: ChatResult) -> bytes:
        message = self.finish(result)
        out = b""
        blocks = message["content"]
        if not self.text_opened and any(b["type"] == "text" for b in blocks):
            out += self._block("text", {"type": "text", "text": ""})  # the empty text block of a reply with no calls
        out += self._close()
        for block in blocks:
            if block["type"] != "tool_use":
                continue
            self.index += 1
            out += _event("content_block_start", index=self.index, content_block={**block, "input": {}})
            out += _event("content_block_delta", index=self.index,
                          delta={"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()})
            out += _event("content_block_stop", index=self.index)
        out += _event("message_delta", delta={"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
                      usage={"input_tokens": message["usage"]["input_tokens"],
                             "output_tokens": message["usage"]["output_tokens"]})
        return out + _event("message_stop")

    def error(self, exc: MtrlError) -> bytes:
        return sse("error", anthropic_error_body(exc)[0])

    def _block(self, kind: str, start: dict[str, Any]) -> bytes:
        """Open a ``kind`` block unless it is the one being written (closing the one before)."""
        if self.open == kind:
            return b""
        out = self._close()
        self.index += 1
        self.open = kind
        self.text_opened = self.text_opened or kind == "text"
        return out + _event("content_block_start", index=self.index, content_block=start)

    def _close(self) -> bytes:
        if self.open is None:
            return b""
        out = b""
        if self.open == "thinking":
            out += _event("content_block_delta", index=self.index, delta={"type": "signature_delta", "signature": SIGNATURE})
        self.open = None
        return out + _event("content_block_stop", index=self.index)


def _event(kind: str, **fields: Any) -> bytes:
    return sse(kind, orjson.dumps({"type": kind, **fields}))


__all__ = ["MessagesEvents"]
