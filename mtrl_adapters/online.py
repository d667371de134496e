"""Online learning from deployed traffic, the agent's side: open a user's session, report its feedback later.

An entrypoint that serves users calls ``OnlineClient.open_session`` when a
session starts. The coordinator (``mtrl online``) draws a share of sessions
for recording; for a drawn one it answers a rollout request (the shape
``context_from_request`` reads), and the entrypoint runs the user's turn
inside that rollout: its model calls are recorded, its answer to the user is
unchanged. Feedback that comes later (a thumbs-up, a ticket resolved, a test
passing; seconds to days) is reported by session id with
``OnlineClient.update_reward`` from whatever process learns it.

The wire schemas both sides read live here; the coordinator imports them.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ._client import RolloutError, coordinator_payload, coordinator_unreachable, ssl_context

log = logging.getLogger("mtrl_adapters")

SESSIONS_PATH = "/online/sessions"
FEEDBACK_PATH = "/online/feedback"
_TIMEOUT = httpx.Timeout(10.0, connect=5.0)


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OpenSession(_Wire):
    """``POST /online/sessions``: a user's session starts; ``instance`` is its task (``prompt`` or ``messages``,
    optional ``ground_truth``, free fields), ``group_key`` what groups it with similar tasks (optional)."""

    session_id: str = Field(min_length=1, max_length=512)
    instance: dict[str, Any]
    group_key: str | None = Field(default=None, min_length=1, max_length=512)


class SessionOpened(_Wire):
    """The answer: ``sampled`` sessions carry ``request``, the rollout request to run the user's turn in."""

    session_id: str
    sampled: bool
    request: dict[str, Any] | None = None


class Feedback(_Wire):
    """``POST /online/feedback``: the reward a session earned, and (``group_by: feedback_key``) its group."""

    session_id: str = Field(min_length=1, max_length=512)
    reward: float
    group_key: str | None = Field(default=None, min_length=1, max_length=512)

    @field_validator("reward")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError(f"must be a finite number, got {value!r}")
        return value


class FeedbackTaken(_Wire):
    """The answer: ``recorded`` False for a session that was not drawn for recording (nothing to train)."""

    session_id: str
    recorded: bool
    state: str | None = None


class OnlineClient:
    """Talks to ``mtrl online``'s coordinator: sessions opened, feedback reported (see the module docstring).

    ``open_session`` never fails a user's request: when the coordinator cannot
    be reached the session is served unrecorded, with a warning, and counted
    in ``unrecorded``. ``update_reward`` raises ``RolloutError`` with the
    coordinator's message (an unknown session: 404; feedback past its expiry: 410).
    """

    def __init__(self, endpoint: str, api_key: str | None = None, *, http: httpx.Client | None = None) -> None:
        self.endpoint = endpoint.rstrip("/")
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = http
        self.unrecorded = 0

    def open_session(self, session_id: str, instance: dict[str, Any], group_key: str | None = None) -> SessionOpened:
        body = OpenSession(session_id=session_id, instance=instance, group_key=group_key)
        try:
            data = self._post(SESSIONS_PATH, body)
        except RolloutError as exc:
            if exc.status is not None and exc.status < 500:
                raise
            self.unrecorded += 1
            log.warning("mtrl online: session %r served unrecorded: %s", session_id, exc.message)
            return SessionOpened(session_id=session_id, sampled=False)
        return SessionOpened.model_validate(data)

    def update_reward(self, session_id: str, reward: float, group_key: str | None = None) -> FeedbackTaken:
        body = Feedback(session_id=session_id, reward=reward, group_key=group_key)
        return FeedbackTaken.model_validate(self._post(FEEDBACK_PATH, body))

    def _post(self, path: str, body: BaseModel) -> Any:
        url = self.endpoint + path
        headers = {**self._headers, "content-type": "application/json"}
        try:
            if self._http is not None:
                response = self._http.post(url, content=body.model_dump_json(), headers=headers)
            else:
                with httpx.Client(timeout=_TIMEOUT, verify=ssl_context()) as http:
                    response = http.post(url, content=body.model_dump_json(), headers=headers)
        except httpx.HTTPError as exc:
            raise coordinator_unreachable(self.endpoint, exc) from None
        return coordinator_payload(response)


__all__ = ["FEEDBACK_PATH", "SESSIONS_PATH", "Feedback", "FeedbackTaken", "OnlineClient", "OpenSession",
           "SessionOpened"]
