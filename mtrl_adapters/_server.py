"""Serve an agent under the rollout-server contract: ``POST /rollout``, ``GET /health``.

The request has SageMaker AI MTRL's rollout-server shape (``instance``,
``metadata``, ``inference_params``, ``model_name``, ``model_endpoint``);
``metadata`` carries ``trajectory_id`` (the rollout id), ``endpoint`` (the
coordinator) and mtrl's ``rollout_token``, ``group_id``, ``max_turns`` and
``timeout_s``. The agent runs inside that rollout and reports its tool calls,
reward and end to the coordinator itself; the response says how it ended.

The server is the standard library's threading HTTP server (one thread per
request), so an agent process needs nothing beyond this package. To mount
the contract in an app of your own, call :func:`handle_rollout_request`
(or :func:`ahandle_rollout_request` from async code).
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Mapping

import httpx
from pydantic import ValidationError

from ._client import describe_error, ssl_context
from ._context import AgentTask, RolloutContext, rollout_scope
from ._values import jsonable, sampling_fields
from ._decorator import is_decorated, rollout
from .wire import RolloutServerRequest, split_trajectory_id

MAX_BODY_BYTES = 16 * 1024 * 1024


def context_from_request(body: Mapping[str, Any] | RolloutServerRequest, *, http: Any = None) -> RolloutContext:
    """The rollout a ``POST /rollout`` body names; a missing field raises ValueError naming it."""
    try:
        request = body if isinstance(body, RolloutServerRequest) else RolloutServerRequest.model_validate(body)
    except ValidationError as exc:
        raise ValueError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())) from None
    meta = request.metadata
    trajectory = meta.get("trajectory_id") or meta.get("trajectoryId")
    rollout_id = split_trajectory_id(str(trajectory))[0] if trajectory else meta.get("rollout_id")
    for name, value in (("metadata.trajectory_id", rollout_id), ("metadata.endpoint", meta.get("endpoint"))):
        if not value:
            raise ValueError(f"{name}: required, got {value!r}")
    token = meta.get("rollout_token")
    if not token:
        raise ValueError(
            "metadata.rollout_token: required (this agent server reports to an mtrl coordinator, "
            f"which sends each rollout's token), got {token!r}"
        )
    return RolloutContext(
        rollout_id=str(rollout_id),
        token=str(token),
        endpoint=str(meta["endpoint"]),
        task=AgentTask.from_instance(request.instance, str(rollout_id)),
        group_id=meta.get("group_id"),
        model_name=request.model_name,
        sampling=sampling_fields(request.inference_params),
        max_turns=meta.get("max_turns"),
        timeout_s=meta.get("timeout_s"),
        http=http,
        policy_models=meta.get("policy_models"),  # HttpExecutor sends the run's setting; absent: every call
    )


def handle_rollout_request(fn: Callable[..., Any], body: Mapping[str, Any], *, http: Any = None) -> dict[str, Any]:
    """Run ``fn`` (decorated or not) for one ``POST /rollout`` body; returns the response body."""
    ctx = context_from_request(body, http=http)
    agent = fn if is_decorated(fn) else rollout(fn)
    result, error = None, None
    with rollout_scope(ctx):
        try:
            result = agent(ctx.task)
            if inspect.isawaitable(result):
                result = asyncio.run(_awaited(result))
        except Exception as exc:
            error = describe_error(exc)
    return rollout_result(ctx, result, error)


async def ahandle_rollout_request(fn: Callable[..., Any], body: Mapping[str, Any], *, http: Any = None) -> dict[str, Any]:
    """:func:`handle_rollout_request` for an async app; sync agents run on a worker thread."""
    ctx = context_from_request(body, http=http)
    agent = fn if is_decorated(fn) else rollout(fn)
    result, error = None, None
    with rollout_scope(ctx):
        try:
            if inspect.iscoroutinefunction(agent):
                result = await agent(ctx.task)
            else:
                result = await asyncio.to_thread(agent, ctx.task)
        except Exception as exc:
            error = describe_error(exc)
    return rollout_result(ctx, result, error)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def rollout_result(ctx: RolloutContext, result: Any, error: str | None) -> dict[str, Any]:
    """The response body of a rollout request: how the rollout ended, and the agent's result."""
    outcome = ctx.outcome
    status = outcome.status if outcome is not None else ("failed" if error else "completed")
    return {
        "rollout_id": ctx.rollout_id,
        "status": status,
        "error": error if error is not None else (outcome.error if outcome is not None else None),
        "reward": outcome.reward if outcome is not None else None,
        "result": jsonable(result),
    }


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # the default backlog (5) resets connections when a group's rollouts arrive at once


@dataclass
class AgentServer:
    """A running agent server; ``stop()`` shuts it down."""

    server: ThreadingHTTPServer
    thread: threading.Thread | None
    http: httpx.Client

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def serve_forever(self) -> None:
        self.server.serve_forever()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        if self.thread is not None:
            self.thread.join(10)
        self.http.close()

    def __enter__(self) -> "AgentServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_agent_server(
    fn: Callable[..., Any], host: str = "127.0.0.1", port: int = 0, *, api_key: str | None = None, background: bool = True
) -> AgentServer:
    """Serve ``fn`` under the rollout-server contract; returns once it accepts connections.

    ``api_key``, when set, must come as ``Authorization: Bearer <api_key>`` on
    ``POST /rollout`` (give it to ``HttpExecutor(api_key=...)``).
    """
    http = httpx.Client(timeout=httpx.Timeout(60.0, connect=10.0), verify=ssl_context(),
                        limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))
    handler = _handler_class(fn, api_key, http)
    server = _Server((host, port), handler)
    thread = None
    if background:
        thread = threading.Thread(target=server.serve_forever, name="mtrl-agent-server", daemon=True)
        thread.start()
    return AgentServer(server, thread, http)


def serve_agent(fn: Callable[..., Any], host: str = "127.0.0.1", port: int = 8080, *, api_key: str | None = None) -> None:
    """Serve ``fn`` until interrupted (the blocking form of :func:`start_agent_server`)."""
    agent = start_agent_server(fn, host, port, api_key=api_key, background=False)
    try:
        agent.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        agent.server.server_close()
        agent.http.close()


def _handler_class(fn: Callable[..., Any], api_key: str | None, http: httpx.Client) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per rollout is noise
            return None

        def do_GET(self) -> None:
            if self.path.rstrip("/") in ("/health", "/ping"):
                self._reply(200, {"status": "healthy"})
            else:
                self._reply(404, _error(f"no route GET {self.path}; this agent server has GET /health"))

        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/rollout":
                self._reply(404, _error(f"no route POST {self.path}; this agent server has POST /rollout"))
                return
            if api_key and not hmac.compare_digest(self.headers.get("authorization", ""), f"Bearer {api_key}"):
                self._reply(401, _error("POST /rollout needs 'Authorization: Bearer <agent server api key>'"))
                return
            try:
                body = self._body()
                response = handle_rollout_request(fn, body, http=http)
            except ValueError as exc:
                self._reply(400, _error(str(exc)))
                return
            except Exception as exc:  # the agent's own errors are in the response; this is ours
                self._reply(500, _error(describe_error(exc)))
                return
            self._reply(200, response)

        def _body(self) -> dict[str, Any]:
            size = int(self.headers.get("content-length") or 0)
            if size > MAX_BODY_BYTES:
                raise ValueError(f"the request body is {size} bytes; the limit is {MAX_BODY_BYTES}")
            try:
                body = json.loads(self.rfile.read(size) or b"null")
            except json.JSONDecodeError as exc:
                raise ValueError(f"the request body is not valid JSON: {exc}") from None
            if not isinstance(body, dict):
                raise ValueError(f"the request body must be a JSON object, got {type(body).__name__}")
            return body

        def _reply(self, status: int, payload: Any) -> None:
            data = json.dumps(payload, default=str).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            if status >= 400:  # the body may be unread: the connection is closed, and the client told so (else it
                self.send_header("connection", "close")  # may reuse it and find it gone: "Server disconnected")
            self.end_headers()
            self.wfile.write(data)

    return Handler


def _error(message: str) -> dict[str, Any]:
    return {"error": {"message": message}}


__all__ = [
    "AgentServer",
    "ahandle_rollout_request",
    "context_from_request",
    "handle_rollout_request",
    "rollout_result",
    "serve_agent",
    "start_agent_server",
]
