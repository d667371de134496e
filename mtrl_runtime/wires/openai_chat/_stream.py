"""A streamed chat completion's ``chat.completion.chunk`` events, written as its tokens are generated.

The server's ``stream_answer`` runs the call and writes these events as each
text delta is decoded. Event order, as OpenAI streams: the role, reasoning and content
deltas as they come, what is left of the final message's content and
reasoning, the parsed tool calls (only at the end: a call's text is never
streamed as content), the finish chunk (with ``token_ids`` when asked and
the logprobs when asked), the usage when asked, ``[DONE]``. The turn is
committed before the finish chunk is written; an error after the first
token is OpenAI's error object as an event.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from ...chat import TextDelta
from ...errors import MtrlError
from ...types import ChatResult
from .._shared import EVENTS
from ._errors import error_body
from ._request import ChatCompletionRequest
from ._response import logprobs, usage


class ChunkEvents:
    """The ``data:`` events of one streamed completion, as bytes (the server's ``EventWriter``)."""

    content_type = EVENTS

    def __init__(self, cid: str, model: str, tokenizer: Any, body: ChatCompletionRequest) -> None:
        self.base = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
        self.tokenizer = tokenizer
        self.body = body

    def chunk(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        payload = {**self.base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, **extra}]}
        return b"data: " + orjson.dumps(payload) + b"\n\n"

    def opening(self, prompt_tokens: int) -> bytes:
        return self.chunk({"role": "assistant", "content": ""})

    def error(self, exc: MtrlError) -> bytes:
        """A failure after the stream opened: OpenAI's error object as an event (the SDK raises it)."""
        return b"data: " + error_body(exc)[0] + b"\n\n"

    def text(self, delta: TextDelta) -> bytes:
        out = b""
        if delta.reasoning:  # the field reasoning servers stream
            out += self.chunk({"reasoning_content": delta.reasoning})
        if delta.content:
            out += self.chunk({"content": delta.content})
        return out

    def closing(self, result: ChatResult) -> bytes:
        """Tool calls, the finish chunk, the usage, ``[DONE]``."""
        body = self.body
        events = [self.chunk({"tool_calls": [{"index": i, **call}]})
                  for i, call in enumerate(result.message.get("tool_calls") or [])]
        extra: dict[str, Any] = {}
        if body.wants_logprobs:
            extra["logprobs"] = logprobs(self.tokenizer, result)
        if body.wants_token_ids:
            extra["token_ids"] = list(result.generation.completion_ids)
        events.append(self.chunk({}, result.finish_reason, **extra))
        if body.stream_options is not None and body.stream_options.include_usage:
            payload = {**self.base, "choices": [], "usage": usage(result)}
            if body.wants_token_ids:
                payload["prompt_token_ids"] = list(result.prompt_ids)
            events.append(b"data: " + orjson.dumps(payload) + b"\n\n")
        events.append(b"data: [DONE]\n\n")
        return b"".join(events)


__all__ = ["ChunkEvents"]
