"""An answered call as an Anthropic ``message``, or as its server-sent events, and refusals in Anthropic's error shape.

Content blocks, in the order the model wrote them: ``thinking`` (the
reasoning; its ``signature`` is a fixed marker, as mtrl signs nothing, so
that clients which keep only signed thinking echo it back), ``text``, then
one ``tool_use`` per tool call (``id`` is the call's id, ``input`` its
parsed arguments). ``stop_reason`` is ``tool_use``, ``max_tokens``,
``stop_sequence`` (with the sequence) or ``end_turn``. The stream is Anthropic's: ``message_start``, per block
``content_block_start`` / ``content_block_delta`` (``thinking_delta`` and
``signature_delta``, ``text_delta``, ``input_json_delta``) /
``content_block_stop``, ``message_delta`` (stop reason, output tokens),
``message_stop``; the route streams them as tokens are decoded
(``_stream``).
"""

from __future__ import annotations

from typing import Any

import orjson

from ...errors import MtrlError
from ...types import ChatResult
from .._shared import object_arguments
from ._maps import ERROR_TYPES, FINISH

SIGNATURE = "mtrl-unsigned"


def content_blocks(result: ChatResult) -> list[dict[str, Any]]:
    message = result.message
    blocks: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content")
    if reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": SIGNATURE})
    content = message.get("content")
    calls = message.get("tool_calls") or []
    if content or not calls:
        blocks.append({"type": "text", "text": content or ""})
    for call in calls:
        fn = call["function"]
        arguments = object_arguments(fn, "Anthropic's tool_use input must be an object")
        blocks.append({"type": "tool_use", "id": call["id"], "name": fn["name"], "input": arguments})
    return blocks


def message_object(message_id: str, model: str, result: ChatResult, stop_sequence: str | None = None) -> dict[str, Any]:
    """The ``message``; ``stop_sequence`` is the request's stop sequence that ended the turn, if one did."""
    stop_reason = "stop_sequence" if stop_sequence is not None else FINISH.to_native(result.finish_reason)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content_blocks(result),
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {
            "input_tokens": len(result.prompt_ids),
            "output_tokens": len(result.generation.completion_ids),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def anthropic_error_body(exc: MtrlError) -> tuple[bytes, dict[str, str]]:
    """Anthropic's error shape (``error.type``, ``error.message``), with the field at fault and the status beside them.

    A 4xx is final, so ``x-should-retry: false`` stops the SDK's retries (it
    retries 409s otherwise); a 5xx may pass, and is retried as usual.
    """
    kind = ERROR_TYPES.get(exc.status, "api_error")
    payload = {"type": "error", "error": {"type": kind, "message": exc.message, "param": exc.param, "code": exc.status}}
    return orjson.dumps(payload), {"x-should-retry": "false"} if exc.status < 500 else {}


__all__ = ["SIGNATURE", "anthropic_error_body", "content_blocks", "message_object"]
