"""SageMaker AI MTRL compatibility: its feedback routes, its headers and its bearer tokens.

An agent written for SageMaker's adapters (``sagemaker.train.rft``) trains
against mtrl by pointing its runtime endpoint at the coordinator: its model
calls name the rollout with ``X-Amzn-SageMaker-Trajectory-Id`` (the OpenAI
routes read it in this mode), and its ``RolloutFeedbackClient`` posts
``/complete-rollout`` then ``/update-reward``. The rollout stays live
between the two (``Coordinator.request_end``), so it never ends without its
reward. A failure reported that way carries no error text (the SDK logs
the text and sends only the status): the rollout then waits for its
executor's answer, which holds the agent's error, and ends with that text;
without an executor it ends ``FAILURE_TEXT_GRACE_S`` after its reward with
a text that says so.

SageMaker's bearer token is a SigV4-presigned URL computed from the
agent's AWS credentials. mtrl accepts such a token only in compatibility
mode (``advanced.server.sagemaker_compat``), and only when its signature
verifies (``_sigv4``) against the credentials the run is configured with
(``advanced.server.sagemaker_access_key_id`` / ``sagemaker_secret``): a
made-up key or signature is a 401. By default only a loopback peer on a
loopback-bound server may send one; ``advanced.server.sagemaker_compat_remote``
lifts that (the signature is checked all the same). A verified token
proves its sender holds the run's AWS secret, so it stands for the run's
agents, not for one rollout: it acts for a rollout only when the request
names the rollout by the trajectory id mtrl handed that rollout's agent,
``<rollout_id>.<mac>`` (``_trajectory``), so one agent cannot report for
another rollout. With the rollout's own token instead, the MAC is optional.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import time
from calendar import timegm
from typing import TypeVar
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError

from mtrl_adapters.wire import CompletionReport, RewardReport, SageMakerCompleteRollout, SageMakerUpdateReward

from ..coordinator import Coordinator, VerifiedToken
from ..errors import BadRequest, Unauthorized
from ..types import AgentEnded, RolloutStatus
from ..validation import describe_errors
from ._http import BodyLimits, bearer_token, json_response, openapi_body, parse_body
from ._sigv4 import signature_problem
from ._trajectory import resolve_trajectory

SIGV4_PREFIX = "sagemaker-api-key-"
_MAX_EXPIRES_S = 43200  # SageMaker's token lifetime cap (12 hours)
FAILURE_TEXT_GRACE_S = 10.0  # a text-less failure waits this long past its reward for its executor's answer

_STATUSES = {
    "ready": RolloutStatus.COMPLETED,
    "completed": RolloutStatus.COMPLETED,
    "succeeded": RolloutStatus.COMPLETED,
    "failed": RolloutStatus.FAILED,
    "error": RolloutStatus.FAILED,
    "timed_out": RolloutStatus.TIMED_OUT,
    "timeout": RolloutStatus.TIMED_OUT,
}


def sigv4_problem(token: str, now: float | None = None) -> str | None:
    """Why ``token`` is not a well-formed, unexpired SageMaker SigV4 presign token (None if it is)."""
    if not token.startswith(SIGV4_PREFIX):
        return f"it does not start with {SIGV4_PREFIX!r}"
    try:
        url = base64.b64decode(token[len(SIGV4_PREFIX):], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return "its body is not base64 text"
    _, _, query = url.partition("?")
    params = {k: v[0] for k, v in parse_qs(query).items()}
    expected = {"Action": "CallWithBearerToken", "X-Amz-Algorithm": "AWS4-HMAC-SHA256"}
    for key, value in expected.items():
        if params.get(key) != value:
            return f"{key} is {params.get(key)!r}, expected {value!r}"
    credential = params.get("X-Amz-Credential", "").split("/")
    if len(credential) != 5 or credential[3] != "sagemaker" or credential[4] != "aws4_request":
        return f"X-Amz-Credential {params.get('X-Amz-Credential')!r} is not a SageMaker SigV4 scope"
    signature = params.get("X-Amz-Signature", "")
    if len(signature) != 64 or any(c not in "0123456789abcdef" for c in signature):
        return "X-Amz-Signature is not 64 hex digits"
    try:
        signed_at = timegm(time.strptime(params.get("X-Amz-Date", ""), "%Y%m%dT%H%M%SZ"))
        expires = int(params.get("X-Amz-Expires", ""))
    except ValueError:
        return f"X-Amz-Date {params.get('X-Amz-Date')!r} / X-Amz-Expires {params.get('X-Amz-Expires')!r} unreadable"
    if not 0 < expires <= _MAX_EXPIRES_S:
        return f"X-Amz-Expires={expires} is outside 1..{_MAX_EXPIRES_S}"
    if (now if now is not None else time.time()) > signed_at + expires:
        return "it has expired"
    return None


def compat_credential(
    peer: str, coordinator: Coordinator, rollout_id: str, token: str | None, bound: bool = False
) -> str | None:
    """The credential to check for ``rollout_id``: the request's token, or a verified SigV4 presign.

    ``peer`` is the client's address; ``bound``: the request named the rollout
    by its trajectory id with a verified MAC. A verified SigV4 token without
    that is a 401: it stands for the run, not for this rollout.
    """
    return bind_credential(coordinator, rollout_id, token, sigv4_verified(peer, coordinator, token), bound)


def bind_credential(
    coordinator: Coordinator, rollout_id: str, token: str | None, verified: bool, bound: bool
) -> str | None:
    """``token`` itself unless it is a verified SigV4 token (``verified``); then the rollout's if ``bound``."""
    if not verified:
        return token
    if not bound:
        coordinator.counters.auth_rejected += 1
        raise Unauthorized(
            f"rollout {rollout_id!r}: a SageMaker SigV4 token acts for a rollout only when the request names it by "
            "the trajectory id mtrl handed its agent ('<rollout_id>.<mac>', metadata.trajectory_id of the /rollout "
            "request, in the X-Amzn-SageMaker-Trajectory-Id header or TrajectoryId); or send the rollout's own token",
            param="authorization",
        )
    return VerifiedToken(rollout_id)


def sigv4_verified(peer: str, coordinator: Coordinator, token: str | None) -> bool:
    """True for a SigV4 token signed with the run's SageMaker credentials; False for any other kind of token.

    A SigV4-shaped token that fails a check raises 401 (nothing read or written).
    """
    cfg = coordinator.server_config
    if not (cfg.sagemaker_compat and token and token.startswith(SIGV4_PREFIX)):
        return False
    if not cfg.sagemaker_compat_remote and not (_loopback(cfg.host) and _loopback(peer)):
        coordinator.counters.auth_rejected += 1
        raise Unauthorized(
            f"SageMaker SigV4 tokens are accepted only on loopback (server {cfg.host!r}, peer {peer!r}) unless "
            "advanced.server.sagemaker_compat_remote is true (the signature is verified either way); "
            "set it, or send the rollout's own token",
            param="authorization",
        )
    if not (cfg.sagemaker_access_key_id and cfg.sagemaker_secret):
        coordinator.counters.auth_rejected += 1
        raise Unauthorized(
            "SageMaker SigV4 tokens are verified against advanced.server.sagemaker_access_key_id and "
            "sagemaker_secret, and this run sets none; set them or send the rollout's own token",
            param="authorization",
        )
    problem = sigv4_problem(token)
    if problem is None:
        url = base64.b64decode(token[len(SIGV4_PREFIX):]).decode()
        problem = signature_problem(url, cfg.sagemaker_access_key_id, cfg.sagemaker_secret)
    if problem is not None:
        coordinator.counters.auth_rejected += 1
        raise Unauthorized(f"the SageMaker bearer token is not valid: {problem}", param="authorization")
    coordinator.counters.compat_sigv4_accepted += 1
    return True


def feedback_credential(
    coordinator: Coordinator, trajectory: str, token: str | None, verified: bool
) -> tuple[str, str | None]:
    """The rollout a feedback body's ``TrajectoryId`` names, and the credential to check for it."""
    rollout_id, bound = resolve_trajectory(coordinator, trajectory, "TrajectoryId")
    return rollout_id, bind_credential(coordinator, rollout_id, token, verified, bound)


class FailureGrace:
    """Ends a rollout that asked to fail without a text when no executor answers for it (see the module docstring)."""

    def __init__(self, coordinator: Coordinator, grace_s: float | None = None) -> None:
        self.coordinator = coordinator
        self.grace_s = FAILURE_TEXT_GRACE_S if grace_s is None else grace_s
        self.tasks: set[asyncio.Task] = set()

    def arm(self, rollout_id: str, status_text: str) -> None:
        task = asyncio.get_running_loop().create_task(self._end_later(rollout_id, status_text))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _end_later(self, rollout_id: str, status_text: str) -> None:
        await asyncio.sleep(self.grace_s)
        error = (
            f"the agent reported Status {status_text!r} to /complete-rollout; SageMaker's feedback client sends "
            f"no error text, and no executor answered for this rollout within {self.grace_s:g} s of its reward"
        )
        if await self.coordinator.end(rollout_id, AgentEnded(RolloutStatus.FAILED, error)):
            self.coordinator.counters.compat_failures_without_text += 1


# a SageMaker feedback body: each names its trajectory
F = TypeVar("F", SageMakerCompleteRollout, SageMakerUpdateReward)


def build_compat_router(coordinator: Coordinator) -> APIRouter:
    router = APIRouter()
    limits = BodyLimits.of(coordinator.server_config)
    grace = FailureGrace(coordinator)

    async def feedback(request: Request, model: type[F]) -> tuple[F, str, str | None]:
        """A feedback body, its rollout and the credential to check for it; a SigV4 token is verified before the
        body is read (a stranger learns no schema)."""
        bearer = bearer_token(request)
        verified = sigv4_verified(_peer(request), coordinator, bearer)
        body = await parse_body(request, model, limits)
        return (body, *feedback_credential(coordinator, body.TrajectoryId, bearer, verified))

    @router.post(
        "/complete-rollout",
        openapi_extra=openapi_body(SageMakerCompleteRollout),
        summary="SageMaker compat: end a trajectory (waits for its reward if none came yet)",
    )
    async def complete_rollout(request: Request) -> Response:
        body, rollout_id, token = await feedback(request, SageMakerCompleteRollout)
        status = _status(body.Status)
        if rollout_id in coordinator.live_rollout_ids() and await coordinator.request_end(rollout_id, token, status):
            return json_response({"TrajectoryId": body.TrajectoryId, "Status": status.value, "Pending": "reward"})
        state = await coordinator.complete(rollout_id, token, CompletionReport(status=status.value))
        return json_response({"TrajectoryId": body.TrajectoryId, "Status": state.status})

    @router.post(
        "/update-reward",
        openapi_extra=openapi_body(SageMakerUpdateReward),
        summary="SageMaker compat: a trajectory's reward (one value) or per-turn rewards (a list)",
    )
    async def update_reward(request: Request) -> Response:
        body, rollout_id, token = await feedback(request, SageMakerUpdateReward)
        await coordinator.report_reward(rollout_id, token, _reward_report(body.Rewards))  # ends one that waited
        if coordinator.requested_end(rollout_id) is RolloutStatus.FAILED:  # rewarded, still waiting for a text
            grace.arm(rollout_id, RolloutStatus.FAILED.value)
            return json_response({"TrajectoryId": body.TrajectoryId, "Status": "failed", "Pending": "executor"})
        return json_response({"TrajectoryId": body.TrajectoryId, "Status": coordinator.state(rollout_id).status})

    return router


def _status(value: str) -> RolloutStatus:
    status = _STATUSES.get(value.strip().lower())
    if status is None:
        raise BadRequest(f"Status: unknown value {value!r}; expected one of {sorted(_STATUSES)}", param="Status")
    return status


def _reward_report(rewards: list[float] | float) -> RewardReport:
    """SageMaker sends ``[r]`` for one reward and ``[r_0, ..., r_T]`` for per-turn rewards."""
    values = rewards if isinstance(rewards, list) else [rewards]
    if not values:
        raise BadRequest("Rewards: give at least one value, got []", param="Rewards")
    try:
        if len(values) == 1:
            return RewardReport(reward=values[0])
        return RewardReport(turn_rewards=values)
    except ValidationError as exc:
        raise BadRequest("Rewards: " + describe_errors(exc.errors(), whole="body"), param="Rewards") from None


def _peer(request: Request) -> str:
    return request.client.host if request.client is not None else ""


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


__all__ = [
    "FAILURE_TEXT_GRACE_S",
    "SIGV4_PREFIX",
    "FailureGrace",
    "bind_credential",
    "build_compat_router",
    "compat_credential",
    "feedback_credential",
    "sigv4_problem",
    "sigv4_verified",
]
