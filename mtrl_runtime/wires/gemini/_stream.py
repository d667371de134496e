"""A streamed Gemini answer, written as its tokens are generated (an ``EventWriter`` of ``server._streaming``).

``streamGenerateContent?alt=sse`` (what google-genai and ADK ask for):
each chunk is one ``GenerateContentResponse`` as a server-sent event with
no event name (``data: {...}``, a blank line after it), as the Gemini API
writes them. Reasoning leaves as ``thought: true`` text parts and text as
text parts, as they are decoded; the last chunk holds the ``functionCall``
parts (each whole: Gemini does not split a call's arguments), the
``finishReason`` and the full ``usageMetadata``. The chunks before it carry
the prompt's token count. A failure after the first chunk is a chunk
holding Google's ``error`` object (google-genai raises it as an
``APIError``).

Without ``alt=sse`` the REST API streams one JSON array of the same
responses; ``array=True`` writes that.
"""

from __future__ import annotations

from typing import Any

import orjson

from ...errors import MtrlError
from ._maps import FINISH
from ._response import chunk, error_payload, response_parts, usage

EVENTS = b"text/event-stream"
JSON = b"application/json"


class GeminiEvents:
    """The chunks of one streamed answer (see the module docstring)."""

    def __init__(self, response_id: str, model: str, array: bool = False) -> None:
        self.response_id = response_id
        self.model = model
        self.array = array
        self.content_type = JSON if array else EVENTS
        self.prompt_tokens = 0
        self.written = 0

    def opening(self, prompt_tokens: int) -> bytes:
        self.prompt_tokens = prompt_tokens
        return b"[" if self.array else b""

    def text(self, delta: Any) -> bytes:
        parts = []
        if delta.reasoning:
            parts.append({"text": delta.reasoning, "thought": True})
        if delta.content:
            parts.append({"text": delta.content})
        if not parts:
            return b""
        return self._frame(chunk(self.response_id, self.model, parts, usage(self.prompt_tokens, None)))

    def closing(self, result: Any) -> bytes:
        calls = response_parts(result.message, text=False)
        # a reply that streamed no text and has no calls still ends with its empty text part
        parts = calls or ([] if self.written else [{"text": ""}])
        last = chunk(self.response_id, self.model, parts,
                     usage(len(result.prompt_ids), len(result.generation.completion_ids)),
                     FINISH.to_native(result.finish_reason))
        return self._frame(last) + (b"]" if self.array else b"")

    def error(self, exc: MtrlError) -> bytes:
        return self._frame(error_payload(exc)) + (b"]" if self.array else b"")

    def _frame(self, payload: dict[str, Any]) -> bytes:
        data = orjson.dumps(payload)
        self.written += 1
        if self.array:
            return (b"," if self.written > 1 else b"") + data + b"\n"
        return b"data: " + data + b"\r\n\r\n"


__all__ = ["GeminiEvents"]
