"""Translation between mtrl's GenerationRequest/Generation and vLLM's ``/v1/completions``.

The prompt goes as token ids; every sampling field is sent explicitly (no
server or model-folder defaults apply); the answer must carry the
completion's token ids (``return_token_ids``) and the sampled token's
logprob. Top alternatives come keyed ``"token_id:<id>"``
(``return_tokens_as_token_ids``), so no token text is parsed.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import httpx

from ...types import Generation, GenerationRequest
from .._checks import check_request


class VLLMRequestError(RuntimeError):
    """The vLLM server refused or failed one request (the message quotes its answer)."""


def completion_body(request: GenerationRequest, model_name: str, max_model_len: int | None) -> dict[str, Any]:
    """The ``/v1/completions`` body; ``max_tokens`` is cut to the room left in the context, as the hf engine does."""
    s = request.sampling
    max_tokens = s.max_tokens
    if max_model_len is not None:
        max_tokens = min(max_tokens, max_model_len - len(request.prompt_ids))
        if max_tokens < 1:
            raise ValueError(f"prompt_ids: {len(request.prompt_ids)} tokens leave no room in the context of {max_model_len}")
    body: dict[str, Any] = {
        "model": model_name,
        "prompt": list(request.prompt_ids),
        "max_tokens": max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": 0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "logprobs": max(1, s.top_logprobs),
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
    }
    if s.stop:
        body["stop"] = list(s.stop)
    if request.stop_token_ids:  # the chat format's stop tokens; vLLM keeps the stop id as the last token id
        body["stop_token_ids"] = sorted(request.stop_token_ids)
    if s.seed is not None:
        body["seed"] = s.seed
    return body


def parse_generation(response: httpx.Response, version: int, top_k: int) -> Generation:
    """The Generation in a 200 answer; anything else raises VLLMRequestError quoting the answer."""
    if response.status_code != 200:
        raise VLLMRequestError(answer_error(response))
    choice = response.json()["choices"][0]
    ids = choice.get("token_ids")
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
    if ids is None or logprobs is None or len(ids) != len(logprobs):
        raise VLLMRequestError(f"the vLLM server's answer lacks token ids or logprobs: {str(choice)[:500]}")
    return generation(ids, logprobs, choice.get("finish_reason"), version,
                      choice["logprobs"].get("top_logprobs") if top_k > 0 else None, top_k)


def generation(
    ids: Sequence[int],
    logprobs: Sequence[float],
    finish: str | None,
    version: int,
    top_entries: Sequence[Mapping[str, float] | None] | None,
    top_k: int,
) -> Generation:
    """The Generation of a finished completion (whole or streamed); a finish other than stop/length raises."""
    if finish not in ("stop", "length"):
        raise VLLMRequestError(f"the vLLM server ended the completion with finish_reason={finish!r}")
    return Generation(
        completion_ids=tuple(int(i) for i in ids),
        logprobs=tuple(float(lp) for lp in logprobs),
        finish_reason=finish,
        policy_version=version,
        top_logprobs_T=top_logprobs(top_entries, top_k) if top_k > 0 else None,
    )


def top_logprobs(
    entries: Sequence[Mapping[str, float] | None] | None, k: int
) -> tuple[tuple[tuple[int, float], ...], ...]:
    """Per token, the ``k`` most likely (token_id, logprob) pairs from vLLM's ``{"token_id:<id>": logprob}``.

    vLLM lists the top k plus the sampled token; the sampled one is dropped
    when it is not among the top k.
    """
    out = []
    for entry in entries or ():
        pairs = sorted(((int(key.rpartition(":")[2]), float(lp)) for key, lp in (entry or {}).items()),
                       key=lambda pair: -pair[1])
        out.append(tuple(pairs[:k]))
    return tuple(out)


def transport_error(exc: httpx.HTTPError, url: str, timeout_s: float) -> VLLMRequestError:
    if isinstance(exc, httpx.TimeoutException):
        return VLLMRequestError(f"the vLLM server at {url} did not answer within {timeout_s:g} s")
    return VLLMRequestError(f"could not reach the vLLM server at {url}: {type(exc).__name__}: {exc}")


def answer_error(response: httpx.Response) -> str:
    return f"the vLLM server answered {response.status_code}: {response.text[:2000]}"


__all__ = ["VLLMRequestError", "answer_error", "check_request", "completion_body", "generation", "parse_generation",
           "top_logprobs", "transport_error"]
