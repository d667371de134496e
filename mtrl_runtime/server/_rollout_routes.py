"""Routes through which an agent reports its tool calls, reward and end.

Each is authenticated by the rollout's own token (``Authorization: Bearer``),
so one rollout can never write another's record.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

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

# what a report route does with a checked body: (rollout id, token, body) -> the JSON answer
Report = Callable[[str, str | None, M], Awaitable[dict[str, Any]]]


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

    def report_route(name: str, model: type[M], summary: str) -> Callable[[Report[M]], Report[M]]:
        """Serve ``record(rollout_id, token, body) -> answer`` as ``POST /rollouts/{rollout_id}/<name>``.

        The rollout's token is checked before the body is read (a stranger
        learns no schema); the body is read within the server's limits and
        decoded as ``model`` (on a worker thread past ``OFF_LOOP_BYTES``:
        validating thousands of calls takes ~0.1 s); the answer is JSON.
        """

        def register(record: Report[M]) -> Report[M]:
            async def endpoint(rollout_id: str, request: Request) -> Response:
                token = bearer_token(request)
                coordinator.check_access(rollout_id, token)
                raw = await read_limited(request, limits.max_bytes)
                if len(raw) > OFF_LOOP_BYTES:
                    body = await asyncio.to_thread(decode_body, raw, model, limits)
                else:
                    body = decode_body(raw, model, limits)
                return json_response(await record(rollout_id, token, body))

            router.add_api_route(f"/rollouts/{{rollout_id}}/{name}", endpoint, methods=["POST"], name=record.__name__,
                                 openapi_extra=openapi_body(model), summary=summary)
            return record

        return register

    @report_route("tool_calls", ToolCallReport, "Record one tool call of a rollout")
    async def tool_call(rollout_id: str, token: str | None, report: ToolCallReport) -> dict[str, Any]:
        await coordinator.record_tool_call(rollout_id, token, report)
        return {"ok": True}

    @report_route("tool_calls/batch", ToolCallBatch, "Record several tool calls of a rollout (an adapter's buffer)")
    async def tool_call_batch(rollout_id: str, token: str | None, batch: ToolCallBatch) -> dict[str, Any]:
        await coordinator.record_tool_calls(rollout_id, token, batch.calls)
        return {"ok": True, "recorded": len(batch.calls)}

    @report_route("model_calls/batch", ModelCallBatch,
                  "Record a rollout's non-policy model calls (passed through to their own endpoints; never trained)")
    async def model_call_batch(rollout_id: str, token: str | None, batch: ModelCallBatch) -> dict[str, Any]:
        await coordinator.record_model_calls(rollout_id, token, batch.calls)
        return {"ok": True, "recorded": len(batch.calls)}

    @report_route("reward", RewardReport, "update_reward: a scalar or per-turn rewards, and metrics")
    async def reward(rollout_id: str, token: str | None, report: RewardReport) -> dict[str, Any]:
        await coordinator.report_reward(rollout_id, token, report)
        return {"ok": True}

    @report_route("complete", CompletionReport, "End a rollout: completed, failed or timed out")
    async def complete(rollout_id: str, token: str | None, report: CompletionReport) -> dict[str, Any]:
        return (await coordinator.complete(rollout_id, token, report)).model_dump()

    @router.get("/rollouts/{rollout_id}", summary="A rollout's status, reward and counts")
    async def state(rollout_id: str, request: Request) -> Response:
        return json_response(coordinator.authorized_state(rollout_id, bearer_token(request)).model_dump())

    return router


__all__ = ["build_rollout_router"]
