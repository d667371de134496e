"""A streamed OpenAI Responses answer, written as its tokens are generated (the server's ``EventWriter``).

``response.created`` and ``response.in_progress`` with the first token; a
``reasoning`` item (``response.reasoning_text.delta``) and a ``message``
item (``response.output_text.delta``) opened as their first text is
decoded; at the end their ``.done`` events with the final text, the
``function_call`` items, and ``response.completed`` (or
``response.incomplete``) with the whole ``response``. Items, ids and order
are those of ``response_object`` for the same result; every event carries
its ``sequence_number``.
"""

from __future__ import annotations

from typing import Any, Callable

import orjson

from ...chat import TextDelta
from ...errors import MtrlError
from ...types import ChatResult
from .._shared import EVENTS, sse
from ..openai_chat import error_body


class ResponsesEvents:
    """The Responses API's events of one streamed response (see the module docstring).

    ``pending`` is the response as ``response.created`` shows it; ``finish(result)`` builds the final one.
    """

    content_type = EVENTS

    def __init__(self, pending: dict[str, Any], finish: Callable[[ChatResult], dict[str, Any]]) -> None:
        self.pending = pending
        self.finish = finish
        self.item_id = pending["id"].removeprefix("resp_")
        self.sequence = 0
        self.opened: list[str] = []  # the types of the items opened while streaming, in order
        self.texts: dict[str, str] = {}

    def opening(self, prompt_tokens: int) -> bytes:
        return self._emit("response.created", response=self.pending) + self._emit("response.in_progress", response=self.pending)

    def text(self, delta: TextDelta) -> bytes:
        out = b""
        if delta.reasoning:
            out += self._open("reasoning")
            out += self._emit("response.reasoning_text.delta", **self._at("reasoning"), content_index=0,
                              delta=delta.reasoning)
            self.texts["reasoning"] = self.texts.get("reasoning", "") + delta.reasoning
        if delta.content:
            out += self._open("message")
            out += self._emit("response.output_text.delta", **self._at("message"), content_index=0,
                              delta=delta.content, logprobs=[])
            self.texts["message"] = self.texts.get("message", "") + delta.content
        return out

    def closing(self, result: ChatResult) -> bytes:
        response = self.finish(result)
        out = b""
        for index, item in enumerate(response["output"]):
            kind = item["type"]
            if kind in self.opened and self.opened.index(kind) == index:
                out += self._done(index, item)
                continue
            out += self._whole(index, item)
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return out + self._emit(kind, response=response)

    def error(self, exc: MtrlError) -> bytes:
        body = orjson.loads(error_body(exc)[0])["error"]
        return self._emit("error", code=body.get("code"), message=body.get("message"), param=body.get("param"))

    # ------------------------------------------------------------------ items
    def _open(self, kind: str) -> bytes:
        if kind in self.opened:
            return b""
        index = len(self.opened)
        self.opened.append(kind)
        if kind == "reasoning":
            item = {"type": "reasoning", "id": f"rs_{self.item_id}", "summary": [], "content": [], "status": "in_progress"}
            return self._emit("response.output_item.added", output_index=index, item=item)
        item = {"type": "message", "id": f"msg_{self.item_id}", "status": "in_progress", "role": "assistant", "content": []}
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return (self._emit("response.output_item.added", output_index=index, item=item)
                + self._emit("response.content_part.added", **self._at("message"), content_index=0, part=part))

    def _at(self, kind: str) -> dict[str, Any]:
        prefix = "rs" if kind == "reasoning" else "msg"
        return {"item_id": f"{prefix}_{self.item_id}", "output_index": self.opened.index(kind)}

    def _done(self, index: int, item: dict[str, Any]) -> bytes:
        """The ``.done`` events of an item streamed so far (its final text, which the deltas spelled)."""
        at = {"item_id": item["id"], "output_index": index}
        if item["type"] == "reasoning":
            text = item["content"][0]["text"]
            out = self._emit("response.reasoning_text.done", **at, content_index=0, text=text)
        else:
            part = item["content"][0]
            out = (self._emit("response.output_text.done", **at, content_index=0, text=part["text"], logprobs=[])
                   + self._emit("response.content_part.done", **at, content_index=0, part=part))
        return out + self._emit("response.output_item.done", output_index=index, item=item)

    def _whole(self, index: int, item: dict[str, Any]) -> bytes:
        """Every event of an item not streamed (a function call, an empty message)."""
        at = {"item_id": item["id"], "output_index": index}
        if item["type"] == "function_call":
            return (self._emit("response.output_item.added", output_index=index,
                               item={**item, "status": "in_progress", "arguments": ""})
                    + self._emit("response.function_call_arguments.delta", **at, delta=item["arguments"])
                    + self._emit("response.function_call_arguments.done", **at, name=item["name"],
                                 arguments=item["arguments"])
                    + self._emit("response.output_item.done", output_index=index, item=item))
        if item["type"] == "reasoning":
            text = item["content"][0]["text"]
            return (self._emit("response.output_item.added", output_index=index,
                               item={**item, "status": "in_progress", "content": []})
                    + self._emit("response.reasoning_text.delta", **at, content_index=0, delta=text)
                    + self._done(index, item))
        part = item["content"][0]
        return (self._emit("response.output_item.added", output_index=index,
                           item={**item, "status": "in_progress", "content": []})
                + self._emit("response.content_part.added", **at, content_index=0, part={**part, "text": ""})
                + self._emit("response.output_text.delta", **at, content_index=0, delta=part["text"], logprobs=[])
                + self._done(index, item))

    def _emit(self, kind: str, **fields: Any) -> bytes:
        event = sse(kind, orjson.dumps({"type": kind, "sequence_number": self.sequence, **fields}))
        self.sequence += 1
        return event


__all__ = ["ResponsesEvents"]
