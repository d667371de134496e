"""An answered call as an OpenAI Responses ``response`` object, or as its server-sent events.

Output items, in the order the model wrote them: a ``reasoning`` item (the
reasoning text as ``reasoning_text`` content, as open-weight servers return
it), a ``message`` with one ``output_text`` part, then one ``function_call``
per tool call (``call_id`` is the call's id, echoed back by
``function_call_output``). A completion cut by ``max_output_tokens`` (or a
content filter) is ``status: "incomplete"`` with ``incomplete_details.reason``
(``_maps``), and its stream
ends with ``response.incomplete`` as OpenAI's does. Streamed events carry the
``sequence_number`` the SDK reads. ``response_events`` writes a finished
response's events at once; the route streams them as tokens are decoded
(``_stream``).
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from ...types import ChatResult
from .._shared import sse
from ._maps import INCOMPLETE
from ._request import NAMESPACE_SEPARATOR


def output_items(result: ChatResult, item_id: str) -> list[dict[str, Any]]:
    """The response's output items (ids derived from ``item_id``, unique per response)."""
    message = result.message
    items: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content")
    if reasoning:
        items.append({"type": "reasoning", "id": f"rs_{item_id}", "summary": [],
                      "content": [{"type": "reasoning_text", "text": reasoning}], "status": "completed"})
    content = message.get("content") or ""
    calls = message.get("tool_calls") or []
    if content or not calls:
        items.append({"type": "message", "id": f"msg_{item_id}", "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "text": content, "annotations": [], "logprobs": []}]})
    for i, call in enumerate(calls):
        fn = call["function"]
        item = {"type": "function_call", "id": f"fc_{item_id}_{i}", "call_id": call["id"], "name": fn["name"],
                "arguments": fn["arguments"], "status": "completed"}
        namespace, dot, name = fn["name"].partition(NAMESPACE_SEPARATOR)  # a namespace tool's (function names hold no dot)
        if dot:
            item.update(namespace=namespace, name=name)
        items.append(item)
    return items


def response_object(response_id: str, model: str, request: Any, sampling: Any, result: ChatResult, store: bool,
                    tools: list[dict[str, Any]], reasoning_tokens: int) -> dict[str, Any]:
    """The ``response`` object of a finished call (``request`` is the validated ``ResponsesRequest``)."""
    prompt = len(result.prompt_ids)
    completion = len(result.generation.completion_ids)
    incomplete = INCOMPLETE.to_native(result.finish_reason)  # "" when the reply ended on its own
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if incomplete else "completed",
        "background": False,
        "error": None,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "metadata": request.metadata or {},
        "model": model,
        "output": output_items(result, response_id.removeprefix("resp_")),
        "parallel_tool_calls": True if request.parallel_tool_calls is None else request.parallel_tool_calls,
        "previous_response_id": request.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": store,
        "temperature": sampling.temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": request.tool_choice if request.tool_choice is not None else "auto",
        "tools": tools,
        "top_p": sampling.top_p,
        "truncation": "disabled",
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": prompt + completion,
        },
        "user": None,
    }


def response_events(response: dict[str, Any]) -> bytes:
    """The finished ``response`` as the Responses API's event stream (see the module docstring)."""
    events: list[bytes] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append(sse(kind, orjson.dumps({"type": kind, "sequence_number": len(events), **fields})))

    pending = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    emit("response.created", response=pending)
    emit("response.in_progress", response=pending)
    for index, item in enumerate(response["output"]):
        kind, item_id = item["type"], item["id"]
        at = {"item_id": item_id, "output_index": index}
        if kind == "message":
            emit("response.output_item.added", output_index=index, item={**item, "status": "in_progress", "content": []})
            part = item["content"][0]
            emit("response.content_part.added", **at, content_index=0, part={**part, "text": ""})
            emit("response.output_text.delta", **at, content_index=0, delta=part["text"], logprobs=[])
            emit("response.output_text.done", **at, content_index=0, text=part["text"], logprobs=[])
            emit("response.content_part.done", **at, content_index=0, part=part)
        elif kind == "reasoning":
            emit("response.output_item.added", output_index=index, item={**item, "status": "in_progress", "content": []})
            text = item["content"][0]["text"]
            emit("response.reasoning_text.delta", **at, content_index=0, delta=text)
            emit("response.reasoning_text.done", **at, content_index=0, text=text)
        else:  # function_call
            emit("response.output_item.added", output_index=index, item={**item, "status": "in_progress", "arguments": ""})
            emit("response.function_call_arguments.delta", **at, delta=item["arguments"])
            emit("response.function_call_arguments.done", **at, name=item["name"], arguments=item["arguments"])
        emit("response.output_item.done", output_index=index, item=item)
    emit("response.incomplete" if response["status"] == "incomplete" else "response.completed", response=response)
    return b"".join(events)


__all__ = ["output_items", "response_events", "response_object"]
