"""The coordinator's FastAPI application and a runner that serves it on a thread."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import threading
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..config import ServerConfig
from ..coordinator import Coordinator
from ..errors import BadRequest, MtrlError
from ._compat_routes import build_compat_router
from ._docs import add_docs_routes
from ._headers import header_deadline_protocol
from ._guard import BodyGuard
from ._sweeper import sweep_abandoned
from ._http import error_response, route_error_response
from ._openai_routes import build_openai_router
from ._openapi import install_openapi
from ._rollout_routes import build_rollout_router
from .protocols import build_routers
from .protocols._openapi import check_documented, openapi_paths as protocol_openapi_paths


def create_app(coordinator: Coordinator) -> FastAPI:
    """The coordinator's HTTP face: OpenAI routes and rollout report routes."""
    app = FastAPI(
        title="mtrl coordinator",
        version="0.1.0",
        description="OpenAI-compatible policy endpoint that records every call of every rollout.",
        lifespan=_lifespan,
        # no OpenTelemetry spans per request: the coordinator records every call itself, and FastAPI's
        # check of the global providers (env lookups) ran on every request, span or not
        telemetry={"tracing": False, "metrics": False, "logs": False},
        openapi_url=None, docs_url=None, redoc_url=None,  # served by _docs, behind the API key when one is set
    )
    app.state.coordinator = coordinator
    # the protocols' plain routes (chat completions first: the hot route), straight in the app's router:
    # matching them through include_router's wrappers cost 0.1 ms a call (bench/bedrock_overhead.py)
    for router in build_routers(coordinator):
        app.router.routes.extend(router.routes)
    app.include_router(build_openai_router(coordinator))
    app.include_router(build_rollout_router(coordinator))
    if coordinator.server_config.sagemaker_compat:
        app.include_router(build_compat_router(coordinator))
    check_documented()
    install_openapi(app, protocol_openapi_paths)  # built on the first request for the document
    server_cfg = coordinator.server_config
    add_docs_routes(app, server_cfg.api_key)
    app.add_middleware(BodyGuard, body_timeout_s=server_cfg.body_timeout_s,
                       max_pending_bodies=server_cfg.max_pending_bodies)

    @app.exception_handler(MtrlError)
    async def _mtrl_error(_: Request, exc: MtrlError) -> Response:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        """Unknown paths (404) and methods (405) answer in OpenAI's error shape too, not ``{"detail": ...}``."""
        return route_error_response(request.method, request.url.path, exc.status_code, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> Response:
        return error_response(BadRequest.naming(exc.errors()))

    return app


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """The startup heap frozen (``_frozen_heap``) and, with ``rollout_ttl_s`` set, the TTL sweeper running."""
    coordinator: Coordinator = app.state.coordinator
    ttl_s = coordinator.server_config.rollout_ttl_s
    async with _frozen_heap(), contextlib.AsyncExitStack() as stack:
        if ttl_s is not None:
            sweeper = asyncio.create_task(sweep_abandoned(coordinator, ttl_s), name="mtrl-rollout-ttl")
            stack.callback(sweeper.cancel)  # stops with the server
        yield


@contextlib.asynccontextmanager
async def _frozen_heap() -> AsyncIterator[None]:
    """At startup, move what the process holds so far (modules, the model) out of the garbage collector's sight.

    Those objects live as long as the process, yet every full collection
    walked them all: some 500,000 objects once transformers is imported,
    0.3 to 1 s a pause, which stalled every request in flight. Frozen, a
    full collection walks only what came later. At shutdown they go back
    (``unfreeze``), so a process that outlives its server (tests, a trainer
    between evaluations) still collects them once they are garbage.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None) -> None:
    """Binding beyond loopback exposes the policy: it needs an API key."""
    if not is_loopback(host) and not api_key:
        raise ValueError(
            f"advanced.server.host={host!r} is not a loopback address; set advanced.server.api_key to bind there"
        )


KEEP_ALIVE_S = 30
"""How long an idle connection stays open. Longer than clients' own idle limit (httpx and openai: 5 s), so a
client never sends on a connection the server is closing at that moment (a ReadError for an agent's report)."""


@dataclass
class ServerHandle:
    """A coordinator served by uvicorn on a background thread (for tests, the trainer and benchmarks)."""

    server: uvicorn.Server
    thread: threading.Thread
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self.server.loop  # type: ignore[attr-defined]

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> "ServerHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Server(uvicorn.Server):
    """Remembers its event loop so other threads can schedule work on it."""

    async def serve(self, sockets=None) -> None:  # type: ignore[override]
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)


def server_config(app: Any, host: str, port: int, header_timeout_s: float | None = None) -> uvicorn.Config:
    """The one uvicorn setup every entry point serves the coordinator with (``start_server``, ``mtrl serve``).

    Each request's line and headers within ``advanced.server.header_timeout_s`` (``_headers``; uvicorn has no
    such bound), idle connections kept ``KEEP_ALIVE_S``, the lifespan on (the frozen heap, the TTL sweeper),
    two seconds for requests in flight at shutdown, no access log. The deadline is the config's of the app
    ``create_app`` built (the default for any other ASGI app, such as a test's wrapper); ``header_timeout_s``
    overrides it. The event loop is uvicorn's choice: uvloop where it is installed.
    """
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        loop="auto",
        http=header_deadline_protocol(header_timeout_s or served_config(app).header_timeout_s),
        timeout_graceful_shutdown=2,
        timeout_keep_alive=KEEP_ALIVE_S,
    )


def served_config(app: Any) -> ServerConfig:
    """The ``advanced.server`` section of an app ``create_app`` built; the defaults for any other ASGI app."""
    coordinator = getattr(app.state, "coordinator", None) if isinstance(app, FastAPI) else None
    return coordinator.server_config if isinstance(coordinator, Coordinator) else ServerConfig()


def start_server(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    header_timeout_s: float | None = None,
) -> ServerHandle:
    """Serve ``app`` (``create_app``) on a background thread, set up by ``server_config``, and return once it
    accepts connections."""
    check_bind(host, api_key)
    server = _Server(server_config(app, host, port, header_timeout_s))
    thread = threading.Thread(target=server.run, name="mtrl-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"the coordinator server failed to start on {host}:{port}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the coordinator server did not start on {host}:{port} within 30 s")
        time.sleep(0.01)
    bound_port = server.servers[0].sockets[0].getsockname()[1]
    return ServerHandle(server=server, thread=thread, host=host, port=bound_port)


__all__ = ["KEEP_ALIVE_S", "ServerHandle", "check_bind", "create_app", "is_loopback", "server_config", "start_server"]
