"""The hot route: ``POST /v1/chat/completions`` and ``POST /rollouts/{id}/v1/chat/completions``.

Every model call of every rollout comes here, so it is a plain ASGI route in
the app's router rather than a FastAPI path operation: no dependency solving,
no Request or Response objects, the body validated once (pydantic, errors
naming the field and the value) and the answer written as bytes in one
response. That saves about 0.15 ms of CPU a call. A streamed call
(``stream: true``) is written event by event as its tokens are generated
(``wires.openai_chat.ChunkEvents``). The OpenAPI document
describes both paths (``openapi_paths``), as FastAPI would.

A call is attributed to a rollout by the path prefix ``/rollouts/{id}/v1``
or the ``x-mtrl-rollout-id`` header; unattributed calls are served only in
inference mode. The answer is built before the turn is committed
(``Coordinator.chat``'s ``respond``). A body over ``OFF_LOOP_BYTES`` is
decoded, checked and turned into its prompt on a worker thread.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from typing import Any

from starlette.routing import BaseRoute, Match, NoMatchFound

from ..coordinator import Coordinator
from ..errors import BadRequest, MtrlError
from ..wires.openai_chat import ChatCompletionRequest, ChunkEvents, completion_json
from ._asgi import ClientGone, Receive, Send, read_body, request_headers, send_body
from ._attribution import attribute_call, scope_peer
from ._http import OFF_LOOP_BYTES, BodyLimits, decode_json, error_body, openapi_body, validate
from ._streaming import stream_answer

CHAT_PATH = "/v1/chat/completions"
ROLLOUT_CHAT_PATH = "/rollouts/{rollout_id}/v1/chat/completions"
_ROLLOUT_PREFIX = "/rollouts/"
_JSON = b"application/json"


class MethodNotAllowed(MtrlError):
    status = 405
    code = "method_not_allowed"


def chat_path_rollout(path: str) -> str | None:
    """``""`` for the unattributed chat path, the rollout id for a rollout's chat path, else None."""
    if path == CHAT_PATH:
        return ""
    if path.startswith(_ROLLOUT_PREFIX) and path.endswith(CHAT_PATH):
        rollout_id = path[len(_ROLLOUT_PREFIX) : -len(CHAT_PATH)]
        if rollout_id and "/" not in rollout_id:
            return rollout_id
    return None


class ChatCompletionsRoute(BaseRoute):
    """Both chat completion paths as one route of the app's router (see the module docstring)."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self.cfg = coordinator.server_config
        self.limits = BodyLimits.of(self.cfg)
        # completion ids: unique, not secret (no system entropy per call)
        self._id_prefix = "chatcmpl-" + secrets.token_hex(6)
        self._ids = itertools.count()

    def matches(self, scope: dict[str, Any]) -> tuple[Match, dict[str, Any]]:
        if scope["type"] != "http":
            return Match.NONE, {}
        rollout_id = chat_path_rollout(scope["path"])
        if rollout_id is None:
            return Match.NONE, {}
        child = {"endpoint": self.handle, "path_params": {"rollout_id": rollout_id} if rollout_id else {}}
        return (Match.FULL if scope["method"] == "POST" else Match.PARTIAL), child

    def url_path_for(self, name: str, /, **path_params: Any) -> Any:
        raise NoMatchFound(name, path_params)

    async def handle(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        try:
            if scope["method"] != "POST":
                raise MethodNotAllowed(f"{scope['method']} {scope['path']}: this route takes POST only", param="method")
            answer = await self._answer(scope, receive, send)
            if answer is None:  # streamed: already written
                return
            body, content_type = answer
            status, headers = 200, {}
        except MtrlError as exc:
            (body, headers), content_type, status = error_body(exc), _JSON, exc.status
            if isinstance(exc, MethodNotAllowed):
                headers["allow"] = "POST"
        except ClientGone:
            return
        await send_body(send, status, body, content_type, headers)

    async def _answer(self, scope: dict[str, Any], receive: Receive, send: Send) -> tuple[bytes, bytes] | None:
        """The completion's JSON for one request, or None once its events were streamed; a refusal raises ``MtrlError``."""
        cfg, coordinator = self.cfg, self.coordinator
        headers = request_headers(scope)
        # before the body: a stranger learns no schema
        rollout_id, token = attribute_call(coordinator, scope["path_params"].get("rollout_id"), headers, scope_peer(scope))
        if rollout_id is not None:
            coordinator.check_access(rollout_id, token)
        raw = await read_body(receive, headers.get(b"content-length"), cfg.max_body_bytes)
        off_loop = len(raw) > OFF_LOOP_BYTES
        data, body = await asyncio.to_thread(self._parse, raw) if off_loop else self._parse(raw)
        sampling = body.sampling(coordinator.default_sampling, coordinator.max_tokens_cap,
                                 coordinator.server_config.max_tokens_over_cap)
        # the request's own message dicts (validated): the coordinator normalizes them, and stores them so
        messages = data["messages"]
        # tools are stored as given, so as validated (defaults filled, nulls dropped)
        tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
        if body.tool_choice == "none":
            tools = None
        cid = f"{self._id_prefix}{next(self._ids):012x}"
        model = body.model or coordinator.model_name
        tokenizer = coordinator.tokenizer
        options = body.options()
        if body.stream:
            events = ChunkEvents(cid, model, tokenizer, body)
            run = lambda stream, respond: coordinator.chat(  # noqa: E731
                rollout_id, token, messages, tools, sampling, options, stream, respond=respond, off_loop=off_loop)
            await stream_answer(run, events, coordinator.counters, receive, send)
            return None

        async def respond(result: Any) -> bytes:  # built before the turn is committed
            return completion_json(cid, model, tokenizer, body, result)

        answer = await coordinator.chat(rollout_id, token, messages, tools, sampling, options, respond=respond,
                                        off_loop=off_loop)
        return answer, _JSON

    def _parse(self, raw: bytes) -> tuple[dict[str, Any], ChatCompletionRequest]:
        """The body's JSON and its validated request, within the server's limits (a 400 naming the field)."""
        data = decode_json(raw, self.limits)
        body = validate(data, ChatCompletionRequest)
        _check_limits(body, self.cfg)
        return data, body


def _check_limits(body: ChatCompletionRequest, cfg: Any) -> None:
    if len(body.messages) > cfg.max_messages:
        raise BadRequest(f"messages: {len(body.messages)} messages; the limit is {cfg.max_messages}", param="messages")
    if body.tools and len(body.tools) > cfg.max_tools:
        raise BadRequest(f"tools: {len(body.tools)} tools; the limit is {cfg.max_tools}", param="tools")
    for i, message in enumerate(body.messages):
        if message.tool_calls and len(message.tool_calls) > cfg.max_tool_calls:
            raise BadRequest(
                f"messages[{i}].tool_calls: {len(message.tool_calls)} tool calls in one message; the limit is "
                f"{cfg.max_tool_calls} (advanced.server.max_tool_calls)", param=f"messages.{i}.tool_calls",
            )
        content = message.content
        size = len(content) if isinstance(content, str) else sum(len(str(p.get("text", ""))) for p in content or [])
        if size > cfg.max_string_chars:
            raise BadRequest(
                f"messages[{i}].content: {size} characters; the limit is {cfg.max_string_chars}",
                param=f"messages.{i}.content",
            )


def openapi_paths() -> dict[str, dict[str, Any]]:
    """The OpenAPI path items of both chat paths (FastAPI documents only its own path operations)."""

    def operation(summary: str, operation_id: str, **extra: Any) -> dict[str, Any]:
        ok = {"description": "The completion; server-sent events when stream is true",
              "content": {"application/json": {"schema": {}}}}
        return {"post": {"summary": summary, "operationId": operation_id, **extra, **openapi_body(ChatCompletionRequest),
                         "responses": {"200": ok}}}

    rollout_param = {"name": "rollout_id", "in": "path", "required": True, "schema": {"type": "string", "title": "Rollout Id"}}
    return {
        CHAT_PATH: operation("OpenAI chat completion (attributed by header, or inference mode)", "chat_completions"),
        ROLLOUT_CHAT_PATH: operation(
            "OpenAI chat completion attributed to a rollout by its path", "rollout_chat_completions", parameters=[rollout_param]
        ),
    }


__all__ = ["CHAT_PATH", "ROLLOUT_CHAT_PATH", "ChatCompletionsRoute", "chat_path_rollout", "openapi_paths"]
