"""What every protocol's route shares: a plain ASGI endpoint that attributes, reads, answers and refuses.

A protocol's endpoint is a Starlette ``Route`` whose app is a ``ProtocolEndpoint``
(no FastAPI Request objects or dependency solving on a call every model turn
makes). One call: ``attribute_call`` names the
rollout and the credential before the body is read (a stranger learns no
schema), the rollout's token is checked, the body is read within the
server's limits and decoded (on a worker thread past ``OFF_LOOP_BYTES``,
where ``Call.off_loop`` then tells the coordinator to build the prompt too),
and the protocol's ``answer`` translates it to ``Coordinator.chat`` and back,
its response body built by ``chat``'s ``respond`` before the turn is
committed, or returns a ``Streamed`` answer that
``server._streaming.stream_answer`` writes as its tokens are generated. A
refusal (``MtrlError``) is written in the protocol's own error shape
(``error_body``). ``post_router`` makes a protocol's router of its paths.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Iterable, TypeVar

from fastapi import APIRouter
from starlette.routing import Route

from ...coordinator import Coordinator
from ...errors import BadRequest, MtrlError
from ...types import SamplingParams
from .._asgi import ClientGone, Receive, Send, read_body, request_headers, send_body
from .._attribution import attribute_call, header, scope_peer
from .._http import OFF_LOOP_BYTES, BodyLimits, decode_json
from .._streaming import EventWriter, Run, stream_answer

T = TypeVar("T")
JSON = b"application/json"

Answer = Callable[["Call"], Any]  # async: (call) -> (body bytes, content type), or Streamed
ErrorBody = Callable[[MtrlError], tuple[bytes, dict[str, str]]]


class Call:
    """One request, attributed and decoded: the rollout (None: inference mode), its token, the JSON body;
    ``off_loop``: a large body, whose prompt the coordinator builds on a worker thread."""

    __slots__ = ("rollout_id", "token", "data", "headers", "off_loop")

    def __init__(self, rollout_id: str | None, token: str | None, data: dict[str, Any], headers: dict[bytes, bytes],
                 off_loop: bool = False) -> None:
        self.rollout_id = rollout_id
        self.token = token
        self.data = data
        self.headers = headers
        self.off_loop = off_loop


class Streamed:
    """A streamed answer: the call to run with a ``ChatStream`` and the protocol's events (``server._streaming``)."""

    __slots__ = ("run", "events")

    def __init__(self, run: Run, events: EventWriter) -> None:
        self.run = run
        self.events = events


class ProtocolEndpoint:
    """The ASGI app of one protocol path (see the module docstring).

    ``token_header`` names a header carrying the credential instead of
    ``Authorization: Bearer`` (Anthropic's SDK sends its key as ``x-api-key``);
    the bearer header is read when it is absent.
    """

    def __init__(self, coordinator: Coordinator, answer: Answer, error_body: ErrorBody, token_header: bytes | None = None) -> None:
        self.coordinator = coordinator
        self.cfg = coordinator.server_config
        self.limits = BodyLimits.of(self.cfg)
        self.answer = answer
        self.error_body = error_body
        self.token_header = token_header

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        try:
            answer = await self._handle(scope, receive)
            if isinstance(answer, Streamed):  # written as its tokens are generated; a refusal raises before
                await stream_answer(answer.run, answer.events, self.coordinator.counters, receive, send)
                return
            body, content_type = answer
            status, headers = 200, {}
        except MtrlError as exc:
            (body, headers), content_type, status = self.error_body(exc), JSON, exc.status
        except ClientGone:
            return
        await send_body(send, status, body, content_type, headers)

    async def _handle(self, scope: dict[str, Any], receive: Receive) -> tuple[bytes, bytes] | Streamed:
        coordinator, cfg = self.coordinator, self.cfg
        headers = request_headers(scope)
        token = header(headers, self.token_header) if self.token_header is not None else None
        path_rollout = scope.get("path_params", {}).get("rollout_id")
        rollout_id, token = attribute_call(coordinator, path_rollout, headers, scope_peer(scope), token=token)
        if rollout_id is not None:
            coordinator.check_access(rollout_id, token)
        raw = await read_body(receive, headers.get(b"content-length"), cfg.max_body_bytes)
        off_loop = len(raw) > OFF_LOOP_BYTES
        data = await asyncio.to_thread(decode_json, raw, self.limits) if off_loop else decode_json(raw, self.limits)
        return await self.answer(Call(rollout_id, token, data, headers, off_loop))


def post_router(routes: Iterable[tuple[str, Any]]) -> APIRouter:
    """A protocol's router: a plain ASGI ``POST`` route for each ``(path, app)``, none in FastAPI's own schema
    (``_openapi`` publishes the protocols' paths with their request models)."""
    router = APIRouter()
    for path, app in routes:
        router.routes.append(Route(path, app, methods=["POST"], include_in_schema=False))
    return router


async def off_loop(call: Call, prepare: Callable[..., T], *args: Any) -> T:
    """``prepare(*args)`` (a protocol's validation and translation): on a worker thread for a large body."""
    return await asyncio.to_thread(prepare, *args) if call.off_loop else prepare(*args)


def check_counts(coordinator: Coordinator, messages: list, tools: list | None, messages_field: str,
                 tools_field: str) -> None:
    """The server's limits on a translated request (the chat ``messages`` a protocol's request became; the errors
    say so): messages and tools per request, tool calls per message, named by the protocol's own fields."""
    cfg = coordinator.server_config
    check_totals(cfg, len(messages), tools, messages_field, tools_field, translated=True)
    limit = cfg.max_tool_calls
    for i, message in enumerate(messages):
        calls = message.get("tool_calls")
        if calls and len(calls) > limit:
            raise BadRequest(
                f"{messages_field}: message {i} after translation holds {len(calls)} tool calls; the limit is {limit} "
                "per message (advanced.server.max_tool_calls)", param=messages_field,
            )


def check_totals(cfg: Any, n_messages: int, tools: list | None, messages_field: str, tools_field: str,
                 translated: bool) -> None:
    """At most ``max_messages`` messages and ``max_tools`` tools in one request (``cfg``: the server's settings):
    a 400 naming the field, the count and the limit. ``translated``: the messages are what a protocol's request
    became (the error says so); chat completions checks its own messages (and each message's tool calls and size,
    in one pass: ``protocols.openai_chat``). Thousands of tool calls in one message held the event loop for seconds."""
    if n_messages > cfg.max_messages:
        after = " after translation" if translated else ""
        raise BadRequest(
            f"{messages_field}: {n_messages} messages{after}; the limit is {cfg.max_messages}",
            param=messages_field,
        )
    if tools and len(tools) > cfg.max_tools:
        raise BadRequest(f"{tools_field}: {len(tools)} tools; the limit is {cfg.max_tools}", param=tools_field)


def sampling(
    coordinator: Coordinator,
    *,
    temperature: float | None,
    top_p: float | None,
    max_tokens: int | None,
    stop: list[str] | None,
    max_tokens_field: str,
    seed: int | None = None,
) -> SamplingParams:
    """A call's sampling over the run's defaults. A ``max_tokens`` above the server's cap is served up to the cap
    (``max_tokens_asked`` keeps what was asked; the rollout is flagged ``max_tokens_clamped``): harness clients ask
    for their own model's maximum (Claude Code 32,000 and more). ``advanced.server.max_tokens_over_cap: refuse``
    makes it a 400 naming the field instead."""
    default = coordinator.default_sampling
    cap = coordinator.max_tokens_cap
    asked = None
    if max_tokens is not None and max_tokens > cap:
        if coordinator.server_config.max_tokens_over_cap == "refuse":
            raise BadRequest(f"{max_tokens_field}: {max_tokens} is above this server's limit of {cap} "
                             "(advanced.server.max_tokens_over_cap: refuse)", param=max_tokens_field)
        asked, max_tokens = max_tokens, cap
    return SamplingParams(
        temperature=default.temperature if temperature is None else temperature,
        top_p=default.top_p if top_p is None else top_p,
        max_tokens=max_tokens or default.max_tokens,
        stop=tuple(stop or default.stop),
        seed=seed,  # the coordinator decides an absent seed (the rollout's, or the run's)
        max_tokens_requested=max_tokens is not None,
        max_tokens_asked=asked,
    )


__all__ = ["Call", "JSON", "ProtocolEndpoint", "Streamed", "check_counts", "check_totals", "off_loop", "post_router",
           "sampling"]
