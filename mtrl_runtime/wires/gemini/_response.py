"""An answered call as a Gemini ``GenerateContentResponse``, and refusals in Google's error shape.

One candidate (``index`` 0, ``role: model``) whose parts are, in the order
the model wrote them: the reasoning as a ``thought: true`` text part, the
text, then one ``functionCall`` per tool call (``id`` the call's id,
``args`` its parsed arguments). A reply with neither text nor calls has one
empty text part. ``finishReason`` is ``MAX_TOKENS`` for a cut completion,
``SAFETY`` for a filtered one, else ``STOP`` (a tool call ends ``STOP`` on
this protocol). ``usageMetadata`` counts the prompt's and the completion's
tokens (``thoughtsTokenCount`` is not split out: the completion's tokens
include the reasoning's). ``modelVersion`` is the served model's name.

The reasoning is written whether or not ``thinkingConfig.includeThoughts``
asked for it: a client that keeps the model's turn sends it back, so the
next prompt renders the turn the policy wrote (``response.text`` of
google-genai leaves thought parts out).
"""

from __future__ import annotations

from typing import Any

import orjson

from ...errors import MtrlError
from .._shared import object_arguments
from ._maps import ERROR_STATUSES, FINISH


def response_parts(message: dict[str, Any], *, text: bool = True, calls: bool = True) -> list[dict[str, Any]]:
    """The candidate's parts of an assistant message (``text``: the thought and text parts; ``calls``: the calls)."""
    parts: list[dict[str, Any]] = []
    tool_calls = message.get("tool_calls") or []
    if text:
        reasoning = message.get("reasoning_content")
        if reasoning:
            parts.append({"text": reasoning, "thought": True})
        content = message.get("content")
        if content or not tool_calls:
            parts.append({"text": content or ""})
    if calls:
        parts.extend(function_call(call) for call in tool_calls)
    return parts


def function_call(call: dict[str, Any]) -> dict[str, Any]:
    fn = call["function"]
    arguments = object_arguments(fn, "Gemini's functionCall.args must be an object")
    return {"functionCall": {"id": call["id"], "name": fn["name"], "args": arguments}}


def usage(prompt_tokens: int, completion_tokens: int | None) -> dict[str, int]:
    out = {"promptTokenCount": prompt_tokens}
    if completion_tokens is not None:
        out["candidatesTokenCount"] = completion_tokens
        out["totalTokenCount"] = prompt_tokens + completion_tokens
    else:
        out["totalTokenCount"] = prompt_tokens
    return out


def chunk(response_id: str, model: str, parts: list[dict[str, Any]], usage_metadata: dict[str, int],
          finish_reason: str | None = None) -> dict[str, Any]:
    """One ``GenerateContentResponse`` (a whole answer, or one chunk of a streamed one)."""
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish_reason is not None:
        candidate["finishReason"] = finish_reason
    return {"candidates": [candidate], "usageMetadata": usage_metadata, "modelVersion": model,
            "responseId": response_id}


def generate_content_response(response_id: str, model: str, result: Any) -> dict[str, Any]:
    """The whole answer of a ``ChatResult``."""
    return chunk(response_id, model, response_parts(result.message),
                 usage(len(result.prompt_ids), len(result.generation.completion_ids)),
                 FINISH.to_native(result.finish_reason))


def error_payload(exc: MtrlError) -> dict[str, Any]:
    """Google's error object: ``code``, ``message``, ``status``, and the field at fault as a ``BadRequest`` detail."""
    error: dict[str, Any] = {"code": exc.status, "message": exc.message,
                             "status": ERROR_STATUSES.get(exc.status, "UNKNOWN")}
    if exc.param:
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.BadRequest",
                             "fieldViolations": [{"field": exc.param, "description": exc.message}]}]
    return {"error": error}


def gemini_error_body(exc: MtrlError) -> tuple[bytes, dict[str, str]]:
    """A refusal as the Gemini API writes one (google-genai raises ``ClientError`` / ``ServerError`` from it); a 4xx
    is final and says so with ``x-should-retry: false``, as every protocol's refusal does."""
    return orjson.dumps(error_payload(exc)), {"x-should-retry": "false"} if exc.status < 500 else {}


__all__ = ["chunk", "error_payload", "function_call", "gemini_error_body", "generate_content_response",
           "response_parts", "usage"]
