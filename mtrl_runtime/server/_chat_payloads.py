"""An answered chat completion as OpenAI's JSON body or as its server-sent events, built as bytes."""

from __future__ import annotations

import time
from typing import Any

import orjson

from ..coordinator import ChatResult
from ._schemas import ChatCompletionRequest


def completion_json(cid: str, model: str, tokenizer: Any, body: ChatCompletionRequest, result: ChatResult) -> bytes:
    """The ``chat.completion`` object; token ids and the policy version when the caller asked for them."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": result.message,
        "finish_reason": result.finish_reason,
        "logprobs": _logprobs(tokenizer, result) if body.wants_logprobs else None,
    }
    payload: dict[str, Any] = {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": _usage(result),
    }
    if body.wants_token_ids:
        choice["token_ids"] = list(result.generation.completion_ids)
        payload["prompt_token_ids"] = list(result.prompt_ids)
        payload["policy_version"] = result.generation.policy_version
    return orjson.dumps(payload)


def completion_events(cid: str, model: str, tokenizer: Any, body: ChatCompletionRequest, result: ChatResult) -> bytes:
    """The completion as ``chat.completion.chunk`` events: role, reasoning, content, tool calls, finish, usage, [DONE].

    The engine answers whole completions, so every event is ready at once and
    they go out in one write; clients read them as a stream all the same.
    """
    base = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        payload = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, **extra}]}
        return b"data: " + orjson.dumps(payload) + b"\n\n"

    events = [chunk({"role": "assistant", "content": ""})]
    reasoning = result.message.get("reasoning_content")
    if reasoning:  # before the answer, as the model wrote it (the field reasoning servers stream)
        events.append(chunk({"reasoning_content": reasoning}))
    content = result.message.get("content")
    if content:
        extra = {"logprobs": _logprobs(tokenizer, result)} if body.wants_logprobs else {}
        events.append(chunk({"content": content}, **extra))
    for i, call in enumerate(result.message.get("tool_calls") or []):
        events.append(chunk({"tool_calls": [{"index": i, **call}]}))
    final_extra: dict[str, Any] = {}
    if body.wants_token_ids:
        final_extra["token_ids"] = list(result.generation.completion_ids)
    events.append(chunk({}, result.finish_reason, **final_extra))
    if body.stream_options is not None and body.stream_options.include_usage:
        payload = {**base, "choices": [], "usage": _usage(result)}
        if body.wants_token_ids:
            payload["prompt_token_ids"] = list(result.prompt_ids)
        events.append(b"data: " + orjson.dumps(payload) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return b"".join(events)


def _usage(result: ChatResult) -> dict[str, int]:
    prompt = len(result.prompt_ids)
    completion = len(result.generation.completion_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _logprobs(tokenizer: Any, result: ChatResult) -> dict[str, Any]:
    gen = result.generation
    content = []
    for i, (tid, lp) in enumerate(zip(gen.completion_ids, gen.logprobs)):
        piece = tokenizer.decode([tid])
        entry: dict[str, Any] = {"token": piece, "logprob": lp, "bytes": list(piece.encode()), "top_logprobs": []}
        if gen.top_logprobs_T is not None and i < len(gen.top_logprobs_T):
            for alt_id, alt_lp in gen.top_logprobs_T[i]:
                alt = tokenizer.decode([alt_id])
                entry["top_logprobs"].append({"token": alt, "logprob": alt_lp, "bytes": list(alt.encode())})
        content.append(entry)
    return {"content": content}


__all__ = ["completion_events", "completion_json"]
