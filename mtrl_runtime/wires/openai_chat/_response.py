"""An answered chat completion as OpenAI's JSON body, built as bytes (its streamed events: ``_stream``)."""

from __future__ import annotations

import time
from typing import Any

import orjson

from ...types import ChatResult
from ._request import ChatCompletionRequest


def completion_json(cid: str, model: str, tokenizer: Any, body: ChatCompletionRequest, result: ChatResult) -> bytes:
    """The ``chat.completion`` object; token ids and the policy version when the caller asked for them."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": result.message,
        "finish_reason": result.finish_reason,
        "logprobs": logprobs(tokenizer, result) if body.wants_logprobs else None,
    }
    payload: dict[str, Any] = {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage(result),
    }
    if body.wants_token_ids:
        choice["token_ids"] = list(result.generation.completion_ids)
        payload["prompt_token_ids"] = list(result.prompt_ids)
        payload["policy_version"] = result.generation.policy_version
    return orjson.dumps(payload)


def usage(result: ChatResult) -> dict[str, int]:
    prompt = len(result.prompt_ids)
    completion = len(result.generation.completion_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def logprobs(tokenizer: Any, result: ChatResult) -> dict[str, Any]:
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


__all__ = ["completion_json", "logprobs", "usage"]
