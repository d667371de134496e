"""vLLM's streamed ``/v1/completions``, read token by token (server-sent events).

The body is the non-streamed one (``_wire.completion_body``) with
``"stream": true``, so the same sampling, stop and logprob fields apply.
vLLM answers ``data: <json>`` events, one per engine step, then
``data: [DONE]``. Each event's ``choices[0]`` carries the step's new token
ids (``token_ids``, asked by ``return_token_ids``) and their logprobs
(``logprobs.token_logprobs``, top alternatives keyed ``"token_id:<id>"``);
the last carries ``finish_reason``. A failure after the stream began is an
event ``{"error": {...}}`` (vLLM's ``create_streaming_error_response``).

``CompletionStream`` reads the events: ``feed(line)`` returns one
``TokenDelta`` per new token, ``result()`` the whole ``Generation``, built
exactly as a non-streamed answer is (``_wire.generation``). A stream that
ends without a finish reason or ``[DONE]`` is an error, never a short
Generation.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from ...types import Generation, GenerationRequest, TokenDelta
from ._wire import VLLMRequestError, completion_body, generation


def stream_body(request: GenerationRequest, model_name: str, max_model_len: int | None) -> dict[str, Any]:
    """The streamed ``/v1/completions`` body: the non-streamed one plus ``stream``."""
    return {**completion_body(request, model_name, max_model_len), "stream": True}


class CompletionStream:
    """The state of one streamed completion: the tokens so far, then its Generation."""

    def __init__(self, version: int, top_k: int) -> None:
        self.version = version
        self.top_k = top_k
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.top_entries: list[Mapping[str, float] | None] = []
        self.finish_reason: str | None = None
        self.done = False

    def feed(self, line: str) -> list[TokenDelta]:
        """One line of the event stream; the tokens it adds, one delta per token."""
        if not line.startswith("data:"):
            return []  # blank separators, comments, other SSE fields
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            self.done = True
            return []
        if self.done:
            raise VLLMRequestError(f"the vLLM server sent an event after [DONE]: {data[:500]}")
        try:
            event = json.loads(data)
        except json.JSONDecodeError:
            raise VLLMRequestError(f"the vLLM server sent an event that is not JSON: {data[:500]}") from None
        if "error" in event:
            raise VLLMRequestError(f"the vLLM server failed the streamed completion: {json.dumps(event['error'])[:2000]}")
        deltas: list[TokenDelta] = []
        for choice in event.get("choices") or ():  # the usage event, if asked, has none
            deltas += self._choice(choice)
        return deltas

    def _choice(self, choice: Mapping[str, Any]) -> list[TokenDelta]:
        if choice.get("index", 0) != 0:
            raise VLLMRequestError(f"the vLLM server streamed choice index {choice.get('index')!r}; mtrl asks for one")
        if self.finish_reason is not None:
            raise VLLMRequestError(f"the vLLM server streamed tokens after finish_reason={self.finish_reason!r}: "
                                   f"{str(choice)[:500]}")
        ids = choice.get("token_ids")
        logprobs = choice.get("logprobs") or {}
        scores = logprobs.get("token_logprobs")
        if ids is None or (ids and scores is None) or len(ids) != len(scores or ()):
            raise VLLMRequestError(f"the vLLM server's streamed event lacks token ids or logprobs: {str(choice)[:500]}")
        if any(score is None for score in scores or ()):
            raise VLLMRequestError(f"the vLLM server streamed a token without a logprob: {str(choice)[:500]}")
        self.ids += [int(i) for i in ids]
        self.logprobs += [float(lp) for lp in scores or ()]
        if self.top_k > 0 and ids:
            tops = logprobs.get("top_logprobs")
            if tops is None or len(tops) != len(ids):
                raise VLLMRequestError(f"the vLLM server's streamed event lacks top logprobs: {str(choice)[:500]}")
            self.top_entries += tops
        self.finish_reason = choice.get("finish_reason")
        return [TokenDelta((int(i),), (float(lp),)) for i, lp in zip(ids, scores or ())]

    def result(self) -> Generation:
        """The whole Generation, equal to the non-streamed answer's; raises if the stream was cut short."""
        if self.finish_reason is None or not self.done:
            missing = "a finish reason" if self.finish_reason is None else "data: [DONE]"
            raise VLLMRequestError(f"the vLLM server's stream ended without {missing} after {len(self.ids)} tokens")
        return generation(self.ids, self.logprobs, self.finish_reason, self.version,
                          self.top_entries if self.top_k > 0 else None, self.top_k)


__all__ = ["CompletionStream", "stream_body"]
