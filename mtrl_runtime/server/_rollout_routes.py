"""Routes through which an agent reports its tool calls, reward and end.

Each is authenticated by the rollout's own token (``Authorization: Bearer``),
so one rollout can never write another's record.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response

from mtrl_adapters.wire import (
    CompletionReport,
    CreatedRollout,
    CreateRolloutRequest,
    ModelCallBatch,
    RewardReport,
    ToolCallBatch,
    ToolCallReport,
    rollout_base_url,
    rollout_base_urls,
    trajectory_id,
)

from ..coordinator import Coordinator
from ..errors import Forbidden, Unauthorized
from ..types import Task
from ._http import (
    OFF_LOOP_BYTES, BodyLimits, M, api_key_matches, bearer_token, decode_body, json_response, openapi_body, parse_body,
    read_limited,
)


def build_rollout_router(coordinator: Coordinator) -> APIRouter:
    router = APIRouter()
    server_cfg = coordinator.server_config
    limits = BodyLimits.of(server_cfg)

    @router.post(
        "/v1/rollouts",
        openapi_extra=openapi_body(CreateRolloutRequest),
        summary="Open a rollout; returns its id, token and base URL",
    )
    async def create(request: Request) -> Response:
        if server_cfg.api_key and not api_key_matches(bearer_token(request), server_cfg.api_key):
            raise Unauthorized("creating rollouts needs 'Authorization: Bearer <api key>'", param="authorization")
        if server_cfg.training_mode and not server_cfg.allow_external_rollouts:
            raise Forbidden(
                "this coordinator serves a training run: its rollouts are opened by the trainer; set "
                "advanced.server.allow_external_rollouts to open rollouts over HTTP", param="authorization",
            )
        body = await parse_body(request, CreateRolloutRequest, limits)
        task = Task(id=body.task_id, prompt=body.prompt, ground_truth=body.ground_truth, data=body.data)
        handle = coordinator.create_rollout(task, body.group_id, max_turns=body.max_turns, seed=body.seed)
        base = str(request.base_url).rstrip("/")
        created = CreatedRollout(
            rollout_id=handle.rollout_id, token=handle.token, group_id=handle.group_id,
            base_url=rollout_base_url(base, handle.rollout_id),
            trajectory_id=trajectory_id(handle.rollout_id, handle.token),
            base_urls=rollout_base_urls(base, handle.rollout_id),
        )
        return json_response(created.model_dump())

    async def checked_body(rollout_id: str, request: Request, model: type[M]) -> tuple[str | None, M]:
        """The request's rollout token, checked before the body is read (a stranger learns no schema), and the body."""
        token = bearer_token(request)
        coordinator.check_access(rollout_id, token)
        return token, await parse_body(request, model, limits)

    @router.post(
        "/rollouts/{rollout_id}/tool_calls",
        openapi_extra=openapi_body(ToolCallReport),
        summary="Record one tool call of a rollout",
    )
    async def tool_call(rollout_id: str, request: Request) -> Response:
        token, report = await checked_body(rollout_id, request, ToolCallReport)
        await coordinator.record_tool_call(rollout_id, token, report)
        return json_response({"ok": True})

    @router.post(
        "/rollouts/{rollout_id}/tool_calls/batch",
        openapi_extra=openapi_body(ToolCallBatch),
        summary="Record several tool calls of a rollout (an adapter's buffer)",
    )
    async def tool_call_batch(rollout_id: str, request: Request) -> Response:
        coordinator.check_access(rollout_id, bearer_token(request))
        raw = await read_limited(request, limits.max_bytes)
        if len(raw) > OFF_LOOP_BYTES:  # validating thousands of calls takes ~0.1 s: off the event loop
            batch = await asyncio.to_thread(decode_body, raw, ToolCallBatch, limits)
        else:
            batch = decode_body(raw, ToolCallBatch, limits)
        await coordinator.record_tool_calls(rollout_id, bearer_token(request), batch.calls)
        return json_response({"ok": True, "recorded": len(batch.calls)})

    @router.post(
        "/rollouts/{rollout_id}/model_calls/batch",
        openapi_extra=openapi_body(ModelCallBatch),
        summary="Record a rollout's non-policy model calls (passed through to their own endpoints; never trained)",
    )
    async def model_call_batch(rollout_id: str, request: Request) -> Response:
        token, batch = await checked_body(rollout_id, request, ModelCallBatch)
        await coordinator.record_model_calls(rollout_id, token, batch.calls)
        return json_response({"ok": True, "recorded": len(batch.calls)})

    @router.post(
        "/rollouts/{rollout_id}/reward",
        openapi_extra=openapi_body(RewardReport),
        summary="update_reward: a scalar or per-turn rewards, and metrics",
    )
    async def reward(rollout_id: str, request: Request) -> Response:
        token, report = await checked_body(rollout_id, request, RewardReport)
        await coordinator.report_reward(rollout_id, token, report)
        return json_response({"ok": True})

    @router.post(
        "/rollouts/{rollout_id}/complete",
        openapi_extra=openapi_body(CompletionReport),
        summary="End a rollout: completed, failed or timed out",
    )
    async def complete(rollout_id: str, request: Request) -> Response:
        token, report = await checked_body(rollout_id, request, CompletionReport)
        state = await coordinator.complete(rollout_id, token, report)
        return json_response(state.model_dump())

    @router.get("/rollouts/{rollout_id}", summary="A rollout's status, reward and counts")
    async def state(rollout_id: str, request: Request) -> Response:
        return json_response(coordinator.authorized_state(rollout_id, bearer_token(request)).model_dump())

    return router


__all__ = ["build_rollout_router"]
