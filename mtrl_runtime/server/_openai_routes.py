"""OpenAI-compatible routes other than chat completions (``protocols.openai_chat``): models and health."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from ..coordinator import Coordinator
from ._http import json_response


def build_openai_router(coordinator: Coordinator) -> APIRouter:
    router = APIRouter()

    async def models() -> Response:
        return json_response(
            {
                "object": "list",
                "data": [{"id": coordinator.model_name, "object": "model", "created": 0, "owned_by": "mtrl"}],
            }
        )

    async def rollout_models(rollout_id: str) -> Response:  # the path parameter declared, so the schema names it
        return await models()

    router.add_api_route("/v1/models", models, methods=["GET"], summary="The served policy model")
    router.add_api_route("/rollouts/{rollout_id}/v1/models", rollout_models, methods=["GET"],
                         summary="The served policy model (under a rollout's base URL)")

    @router.get("/health", summary="Liveness, policy version and counters")
    async def health() -> Response:
        return json_response(
            {
                "status": "ok",
                "model": coordinator.served_model,
                "engine": coordinator.engine_name,
                "policy_version": coordinator.policy_version,
                "live_rollouts": len(coordinator.live_rollout_ids()),
            }
        )

    return router


__all__ = ["build_openai_router"]
