"""The AgentCore executor: runs each rollout on a deployed Amazon Bedrock AgentCore Runtime, named by its ARN.

Each rollout is one ``InvokeAgentRuntime`` call through boto3's
``bedrock-agentcore`` client, in a runtime session of its own
(``runtimeSessionId`` ``mtrl-<rollout id>-<random>``, the 33 characters
or more the API asks for), on the endpoint ``qualifier`` names. The
payload is the rollout request ``HttpExecutor`` posts to an agent server
(``rollout_request_body``: ``instance`` = the task, ``metadata`` with the
coordinator's URL and the rollout's token), plus the task's ``prompt`` at
the top level where the row has one, which is where an AgentCore
entrypoint written from the AWS samples reads it. An entrypoint wrapped
with ``mtrl_integrations.agentcore.trainable`` reads that metadata: its
model calls go to the coordinator under the rollout's token and its tool
calls and reward are recorded. The URL in the payload is
``advanced.agentcore.coordinator_url`` when set: the runtime runs in AWS,
so it must reach the coordinator at an address it can route to.

Authentication: SigV4 with boto3's credential chain (``profile``), or, for
a runtime configured for OAuth (inbound JWT), the same request with
``Authorization: Bearer <token>`` and no signature (AWS documents that
such a runtime is called over HTTPS with the token instead of the SDK's
signature; the request is otherwise the SDK's own).

The answer is JSON (``application/json``: the rollout's result as
``trainable`` returns it) or a server-sent event stream
(``text/event-stream``: a generator entrypoint's events; the last one is
the result when it is one, and the app's error event fails the rollout).
A service error (ThrottlingException, ResourceNotFoundException,
AccessDeniedException, a runtime's own failure...) fails the rollout with
the service's code and message; a ThrottlingException is retried first
(``throttle_retries``): the service refuses it before the runtime runs.
The coordinator is told by the dispatcher, as for any executor; the
outcome never turns a failure into a reward.

boto3 is synchronous: calls run on a thread pool of ``max_connections``
threads (as many as the client's connection pool), off the event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from ..types import RolloutOutcome, RolloutSpec, RolloutStatus
from ._agentcore_settings import AgentCoreSettings, RuntimeArn, parse_runtime_arn
from ._http import DEFAULT_JOB_ARN, rollout_request_body

log = logging.getLogger(__name__)

_FINAL = {s.value: s for s in RolloutStatus if s.is_final} | {"error": RolloutStatus.FAILED}
ACCEPT = "application/json, text/event-stream"
SESSION_ID_MIN, SESSION_ID_MAX = 33, 256  # the API's bounds on runtimeSessionId
_TIMEOUT_MARGIN_S = 30.0  # the read timeout beyond the rollout's own: the dispatcher's deadline comes first
_BACKOFF_S = 1.0


def runtime_session_id(rollout_id: str) -> str:
    """A fresh runtime session id for one rollout: ``mtrl-<rollout id>-<32 hex>``, within the API's 33..256."""
    session = f"mtrl-{rollout_id}-{uuid.uuid4().hex}"
    return session if len(session) <= SESSION_ID_MAX else f"mtrl-{uuid.uuid4().hex}{uuid.uuid4().hex}"


def default_payload(spec: RolloutSpec, body: dict[str, Any]) -> dict[str, Any]:
    """The rollout request, with the task's prompt also at the top level (``payload["prompt"]``) when it has one."""
    prompt = spec.task.prompt
    return {"prompt": prompt, **body} if prompt is not None and "prompt" not in body else body


@dataclass
class AgentCoreCounters:
    """What the executor saw, per kind: invocations made, throttles retried, service errors by code, sessions stopped."""

    invocations: int = 0
    throttle_retries: int = 0
    service_errors: dict[str, int] = field(default_factory=dict)
    sessions_stopped: int = 0
    stop_failures: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, name: str, code: str | None = None) -> None:
        """Count one event (from any of the executor's threads)."""
        with self._lock:
            if code is None:
                setattr(self, name, getattr(self, name) + 1)
            else:
                self.service_errors[code] = self.service_errors.get(code, 0) + 1


class AgentCoreExecutor:
    """Runs rollouts on a deployed AgentCore Runtime by ARN (see the module docstring).

    ``settings``: ``advanced.agentcore`` (its ``runtime_arn`` is ignored: the ARN is the first argument).
    ``client``: a ``bedrock-agentcore`` client to use as is (your own session, role or endpoint); None: one is made
    from ``settings``. ``bearer_token``: for ``auth: bearer``, the token or a function returning a fresh one; None:
    the environment variable ``settings.bearer_token_env``, read at each call.
    ``payload``: ``(spec, rollout_request) -> dict``, the JSON the runtime receives (default ``default_payload``).
    """

    def __init__(
        self,
        runtime_arn: str | RuntimeArn,
        settings: AgentCoreSettings | None = None,
        *,
        client: Any = None,
        bearer_token: str | Callable[[], str] | None = None,
        payload: Callable[[RolloutSpec, dict[str, Any]], Mapping[str, Any]] = default_payload,
        max_connections: int = 64,
        job_arn: str = DEFAULT_JOB_ARN,
    ) -> None:
        self.arn = runtime_arn if isinstance(runtime_arn, RuntimeArn) else parse_runtime_arn(runtime_arn, "runtime_arn")
        self.settings = settings if settings is not None else AgentCoreSettings()
        if max_connections < 1:
            raise ValueError(f"max_connections: must be >= 1, got {max_connections}")
        self.payload = payload
        self.job_arn = job_arn
        self.counters = AgentCoreCounters()
        self._token = self._token_source(bearer_token)
        self._client = client if client is not None else self._make_client(max_connections)
        if self._token is not None:  # an OAuth runtime: the token goes on every call, of our client or the caller's
            token = self._token
            self._client.meta.events.register(
                "before-send.bedrock-agentcore.*",
                lambda request, **_: request.headers.__setitem__("Authorization", f"Bearer {token()}"),
            )
        self._pool = ThreadPoolExecutor(max_connections, thread_name_prefix="mtrl-agentcore")
        self._closed = False

    # -- the client ------------------------------------------------------------------------------

    def _token_source(self, bearer_token: str | Callable[[], str] | None) -> Callable[[], str] | None:
        if self.settings.auth != "bearer":
            if bearer_token is not None:
                raise ValueError("bearer_token: given, but advanced.agentcore.auth is 'sigv4'; set auth: bearer")
            return None
        if callable(bearer_token):
            return bearer_token
        if bearer_token is not None:
            return lambda: bearer_token
        env = self.settings.bearer_token_env
        if not os.environ.get(env):
            raise ValueError(f"advanced.agentcore.bearer_token_env: the environment variable {env!r} is not set; "
                             "put the runtime's OAuth access token there (auth: bearer)")
        return lambda: os.environ[env]

    def _make_client(self, max_connections: int) -> Any:
        try:
            import boto3
            from botocore import UNSIGNED
            from botocore.config import Config
        except ImportError as exc:  # pragma: no cover - boto3 comes with the agentcore and bedrock extras
            raise ImportError("the AgentCore executor needs boto3: pip install 'mtrl-agents[agentcore]'") from exc
        cfg = self.settings
        options: dict[str, Any] = {
            "retries": {"total_max_attempts": 1, "mode": "standard"},  # retries are ours: a rollout must not run twice
            "max_pool_connections": max_connections,
            "connect_timeout": 10,
            # a JSON answer comes when the rollout ends: no byte for as long as the rollout runs. The dispatcher's
            # deadline bounds the rollout (and stops its session); this only frees a thread the service forgot
            "read_timeout": 8 * 3600,
        }
        if cfg.auth == "bearer":
            options["signature_version"] = UNSIGNED
        session = boto3.session.Session(profile_name=cfg.profile, region_name=self.arn.region)
        return session.client("bedrock-agentcore", endpoint_url=cfg.endpoint_url, config=Config(**options))

    # -- one rollout -----------------------------------------------------------------------------

    def request_payload(self, spec: RolloutSpec) -> bytes:
        """The bytes ``InvokeAgentRuntime`` sends for ``spec`` (the coordinator's URL as the runtime reaches it)."""
        body = rollout_request_body(spec, self.job_arn, self.arn.region, self.settings.coordinator_url)
        return json.dumps(dict(self.payload(spec, body))).encode()

    async def run(self, spec: RolloutSpec) -> RolloutOutcome:
        if self._closed:
            raise RuntimeError("the AgentCore executor is closed")
        session_id = runtime_session_id(spec.rollout_id)
        body = self.request_payload(spec)
        loop = asyncio.get_running_loop()
        try:
            status, error = await loop.run_in_executor(self._pool, self._invoke, spec.rollout_id, session_id, body)
        finally:  # also on the dispatcher's deadline (a cancel): the session's work is stopped
            if self.settings.stop_sessions and not self._closed:
                self._pool.submit(self._stop, session_id)
        return RolloutOutcome(spec.rollout_id, status, error)

    def _invoke(self, rollout_id: str, session_id: str, body: bytes) -> tuple[RolloutStatus, str | None]:
        from botocore.exceptions import BotoCoreError, ClientError

        cfg = self.settings
        request: dict[str, Any] = {
            "agentRuntimeArn": self.arn.arn, "qualifier": cfg.qualifier, "runtimeSessionId": session_id,
            "payload": body, "contentType": "application/json", "accept": ACCEPT,
        }
        if cfg.runtime_user_id:
            request["runtimeUserId"] = cfg.runtime_user_id
        for attempt in range(cfg.throttle_retries + 1):
            self.counters.add("invocations")
            try:
                response = self._client.invoke_agent_runtime(**request)
                break
            except ClientError as exc:
                code, text = _service_error(exc)
                if code == "ThrottlingException" and attempt < cfg.throttle_retries:
                    self.counters.add("throttle_retries")
                    time.sleep(_BACKOFF_S * 2 ** attempt)
                    continue
                self.counters.add("service_errors", code)
                return RolloutStatus.FAILED, f"{text} [InvokeAgentRuntime on {self.arn}, session {session_id}]"
            except BotoCoreError as exc:
                return RolloutStatus.FAILED, (f"could not reach the AgentCore service: {type(exc).__name__}: {exc} "
                                              f"[InvokeAgentRuntime on {self.arn}, session {session_id}]")
        stream = response["response"]
        try:
            if response.get("contentType", "").startswith("text/event-stream"):
                return _stream_outcome(rollout_id, _sse_events(stream.iter_lines()))
            return _json_outcome(rollout_id, stream.read())
        except (BotoCoreError, OSError) as exc:  # the answer broke off (a reset, a read timeout)
            return RolloutStatus.FAILED, (f"the runtime's answer broke off: {type(exc).__name__}: {exc} "
                                          f"[InvokeAgentRuntime on {self.arn}, session {session_id}]")
        finally:
            stream.close()

    def _stop(self, session_id: str) -> None:
        """End a rollout's runtime session (best effort: a failure is counted and logged, the rollout stands)."""
        try:
            self._client.stop_runtime_session(agentRuntimeArn=self.arn.arn, qualifier=self.settings.qualifier,
                                              runtimeSessionId=session_id)
            self.counters.add("sessions_stopped")
        except Exception as exc:  # noqa: BLE001 - the session ends on its own after its idle timeout
            self.counters.add("stop_failures")
            log.warning("mtrl: StopRuntimeSession %s on %s failed: %s", session_id, self.arn, exc)

    async def close(self) -> None:
        """Wait for pending session stops, then close the client's connections."""
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._pool.shutdown, True)
        close = getattr(self._client, "close", None)
        if callable(close):
            close()


def _service_error(exc: Any) -> tuple[str, str]:
    """(code, one line naming the code, HTTP status and the service's message) from a botocore ClientError."""
    error = exc.response.get("Error", {})
    code = error.get("Code") or "Unknown"
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    message = error.get("Message") or str(exc)
    return code, f"{code} (HTTP {status}): {message}"


def _sse_events(lines: Iterable[bytes]) -> Iterable[Any]:
    """The events of a server-sent event stream: each event's ``data:`` lines joined, as JSON where they parse."""
    data: list[str] = []
    for raw in [*lines, b""]:
        line = raw.decode("utf-8", errors="replace").rstrip("\r")
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif not line and data:
            text = "\n".join(data)
            data = []
            try:
                yield json.loads(text)
            except ValueError:
                yield text


def _stream_outcome(rollout_id: str, events: Iterable[Any]) -> tuple[RolloutStatus, str | None]:
    """A streamed answer's outcome: the app's error event fails it; a closing result event is read like JSON."""
    last, count = None, 0
    for last in events:
        count += 1
    if isinstance(last, Mapping) and "error" in last and "error_type" in last:  # BedrockAgentCoreApp's error event
        return RolloutStatus.FAILED, f"the runtime's stream ended in an error: {last['error_type']}: {last['error']}"
    if isinstance(last, Mapping) and last.get("rollout_id") == rollout_id and last.get("status") in _FINAL:
        return _FINAL[last["status"]], last.get("error")
    return RolloutStatus.COMPLETED, None  # a plain event stream: the coordinator's own record decides the rest


def _json_outcome(rollout_id: str, raw: bytes) -> tuple[RolloutStatus, str | None]:
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        return RolloutStatus.COMPLETED, None  # not mtrl's answer: what the rollout recorded decides
    reported = body.get("status") if isinstance(body, Mapping) else None
    if isinstance(reported, str) and reported in _FINAL:
        return _FINAL[reported], body.get("error")
    return RolloutStatus.COMPLETED, None


__all__ = ["ACCEPT", "AgentCoreCounters", "AgentCoreExecutor", "default_payload", "runtime_session_id"]
