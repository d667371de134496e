"""OpenAI-compatible routes: chat completions (plain and SSE), models, health.

A call is attributed to a rollout by the path prefix ``/rollouts/{id}/v1``
or the ``x-mtrl-rollout-id`` header; unattributed calls are served only in
inference mode.
"""

from __future__ import annotations

import secrets
import time
from typing import Any, AsyncIterator

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from mtrl_adapters.wire import HEADER_ROLLOUT_ID, HEADER_SM_TRAJECTORY_ID

from ..coordinator import ChatResult, Coordinator
from ..errors import BadRequest, Unauthorized
from ._compat_routes import compat_credential
from ._http import bearer_token, json_response, openapi_body, parse_body
from ._schemas import ChatCompletionRequest


def build_openai_router(coordinator: Coordinator) -> APIRouter:
    router = APIRouter()
    cfg = coordinator.config.advanced.server

    async def chat(request: Request, path_rollout_id: str | None) -> Response:
        body = await parse_body(request, ChatCompletionRequest, cfg.max_body_bytes, cfg.max_string_chars)
        _check_limits(body, cfg)
        rollout_id = path_rollout_id or request.headers.get(HEADER_ROLLOUT_ID)
        if rollout_id is None and cfg.sagemaker_compat:
            rollout_id = request.headers.get(HEADER_SM_TRAJECTORY_ID)
        token = bearer_token(request)
        if rollout_id is not None and cfg.sagemaker_compat:
            token = compat_credential(request, coordinator, rollout_id, token)
        if rollout_id is None:
            if not cfg.inference_mode:
                raise BadRequest(
                    f"no rollout named: send the {HEADER_ROLLOUT_ID} header or call /rollouts/{{id}}/v1/chat/completions; "
                    "calls that name no rollout are served only in inference mode",
                    param=HEADER_ROLLOUT_ID,
                )
            if cfg.api_key and token != cfg.api_key:
                raise Unauthorized("inference calls need 'Authorization: Bearer <api key>'", param="authorization")
        sampling = body.sampling(coordinator.default_sampling, coordinator.max_tokens_cap)
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
        if body.tool_choice == "none":
            tools = None
        result = await coordinator.chat(rollout_id, token, messages, tools, sampling)
        completion_id = "chatcmpl-" + secrets.token_hex(12)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(
                _sse(completion_id, coordinator, body, result, include_usage),
                media_type="text/event-stream",
            )
        return json_response(_completion(completion_id, coordinator, body, result))

    @router.post(
        "/v1/chat/completions",
        openapi_extra=openapi_body(ChatCompletionRequest),
        summary="OpenAI chat completion (attributed by header, or inference mode)",
    )
    async def chat_completions(request: Request) -> Response:
        return await chat(request, None)

    @router.post(
        "/rollouts/{rollout_id}/v1/chat/completions",
        openapi_extra=openapi_body(ChatCompletionRequest),
        summary="OpenAI chat completion attributed to a rollout by its path",
    )
    async def rollout_chat_completions(rollout_id: str, request: Request) -> Response:
        return await chat(request, rollout_id)

    def models() -> Response:
        return json_response(
            {
                "object": "list",
                "data": [{"id": coordinator.model_name, "object": "model", "created": 0, "owned_by": "mtrl"}],
            }
        )

    router.add_api_route("/v1/models", models, methods=["GET"], summary="The served policy model")
    router.add_api_route("/rollouts/{rollout_id}/v1/models", models, methods=["GET"], summary="The served policy model")

    @router.get("/health", summary="Liveness, policy version and counters")
    def health() -> Response:
        return json_response(
            {
                "status": "ok",
                "model": coordinator.model_name,
                "engine": coordinator.engine.name,
                "policy_version": coordinator.policy_version,
                "live_rollouts": len(coordinator.live_rollout_ids()),
            }
        )

    return router


def _check_limits(body: ChatCompletionRequest, cfg: Any) -> None:
    if len(body.messages) > cfg.max_messages:
        raise BadRequest(f"messages: {len(body.messages)} messages; the limit is {cfg.max_messages}", param="messages")
    if body.tools and len(body.tools) > cfg.max_tools:
        raise BadRequest(f"tools: {len(body.tools)} tools; the limit is {cfg.max_tools}", param="tools")
    for i, message in enumerate(body.messages):
        content = message.content
        size = len(content) if isinstance(content, str) else sum(len(str(p.get("text", ""))) for p in content or [])
        if size > cfg.max_string_chars:
            raise BadRequest(
                f"messages[{i}].content: {size} characters; the limit is {cfg.max_string_chars}",
                param=f"messages.{i}.content",
            )


def _usage(result: ChatResult) -> dict[str, int]:
    prompt = len(result.prompt_ids)
    completion = len(result.generation.completion_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _logprobs(coordinator: Coordinator, result: ChatResult) -> dict[str, Any]:
    tokenizer = coordinator.engine.tokenizer
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


def _completion(cid: str, coordinator: Coordinator, body: ChatCompletionRequest, result: ChatResult) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "message": result.message,
        "finish_reason": result.finish_reason,
        "logprobs": _logprobs(coordinator, result) if body.wants_logprobs else None,
    }
    payload: dict[str, Any] = {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.model or coordinator.model_name,
        "choices": [choice],
        "usage": _usage(result),
    }
    if body.wants_token_ids:
        choice["token_ids"] = list(result.generation.completion_ids)
        payload["prompt_token_ids"] = list(result.prompt_ids)
        payload["policy_version"] = result.generation.policy_version
    return payload


async def _sse(
    cid: str, coordinator: Coordinator, body: ChatCompletionRequest, result: ChatResult, include_usage: bool
) -> AsyncIterator[bytes]:
    """The answered completion as OpenAI stream chunks: role, content, tool calls, finish, usage."""
    base = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": body.model or coordinator.model_name,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        payload = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, **extra}]}
        return b"data: " + orjson.dumps(payload) + b"\n\n"

    yield chunk({"role": "assistant", "content": ""})
    content = result.message.get("content")
    if content:
        extra = {"logprobs": _logprobs(coordinator, result)} if body.wants_logprobs else {}
        yield chunk({"content": content}, **extra)
    for i, call in enumerate(result.message.get("tool_calls") or []):
        yield chunk({"tool_calls": [{"index": i, **call}]})
    final_extra: dict[str, Any] = {}
    if body.wants_token_ids:
        final_extra["token_ids"] = list(result.generation.completion_ids)
    yield chunk({}, result.finish_reason, **final_extra)
    if include_usage:
        payload = {**base, "choices": [], "usage": _usage(result)}
        if body.wants_token_ids:
            payload["prompt_token_ids"] = list(result.prompt_ids)
        yield b"data: " + orjson.dumps(payload) + b"\n\n"
    yield b"data: [DONE]\n\n"


__all__ = ["build_openai_router"]
