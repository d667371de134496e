"""``mtrl online``'s HTTP routes, on the coordinator's app beside the policy endpoint.

``POST /online/sessions`` (a user's session starts: drawn or not, and the
rollout request to run it in), ``POST /online/feedback`` (``update_reward``
by session id), ``GET /online/status`` (the serving version, the promoted
adapters, the last gate, the counts), ``POST /online/rollback``. With
``advanced.server.api_key`` set, each needs ``Authorization: Bearer <key>``.
Bad bodies are 400s naming the field and the value; an unknown session 404,
feedback past its expiry 410, a second feedback or session 409.
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Any, Protocol, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from mtrl_adapters.online import FEEDBACK_PATH, SESSIONS_PATH, Feedback, FeedbackTaken, OpenSession, SessionOpened

from ..errors import BadRequest, Unauthorized

M = TypeVar("M", bound=BaseModel)
MAX_BODY_BYTES = 1 << 20


class OnlineEndpoints(Protocol):
    """What the routes call (``OnlineService``)."""

    def open_session(self, body: OpenSession, endpoint: str) -> SessionOpened: ...

    def feedback(self, body: Feedback) -> FeedbackTaken: ...

    def status(self) -> dict[str, Any]: ...

    async def rollback(self) -> dict[str, Any]: ...


def build_online_router(service: OnlineEndpoints, api_key: str | None = None) -> APIRouter:
    router = APIRouter()

    def check_key(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        given = header[7:] if header.lower().startswith("bearer ") else ""
        if not hmac.compare_digest(given.encode(), api_key.encode()):
            raise Unauthorized("the online routes need 'Authorization: Bearer <api key>'", param="authorization")

    @router.post(SESSIONS_PATH, summary="A user's session starts: recorded (a rollout) or not")
    async def open_session(request: Request) -> JSONResponse:
        check_key(request)
        body = await _parse(request, OpenSession)
        # store writes (the task, the rollout, the session): off the loop that answers users
        opened = await asyncio.to_thread(service.open_session, body, str(request.base_url).rstrip("/"))
        return JSONResponse(opened.model_dump())

    @router.post(FEEDBACK_PATH, summary="update_reward by session id: the feedback a session earned")
    async def feedback(request: Request) -> JSONResponse:
        check_key(request)
        body = await _parse(request, Feedback)
        return JSONResponse((await asyncio.to_thread(service.feedback, body)).model_dump())

    @router.get("/online/status", summary="The serving adapter, the promoted ones, the last gate, the counts")
    async def status(request: Request) -> JSONResponse:
        check_key(request)
        return JSONResponse(service.status())

    @router.post("/online/rollback", summary="Serve the adapter promoted before the current one again")
    async def rollback(request: Request) -> JSONResponse:
        check_key(request)
        return JSONResponse(await service.rollback())

    return router


async def _parse(request: Request, model: type[M]) -> M:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise BadRequest(f"body: {len(raw)} bytes, more than {MAX_BODY_BYTES}", param="body")
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise BadRequest.naming(exc.errors()) from None


__all__ = ["OnlineEndpoints", "build_online_router"]
