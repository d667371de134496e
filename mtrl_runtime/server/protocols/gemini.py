"""Gemini: ``POST /v1beta/models/{model}:generateContent`` and ``:streamGenerateContent``, streamed and not.

Also under ``/v1/`` (what google-genai 3 calls by default) and under
``/rollouts/{rollout_id}/...``, where ``mtrl_adapters`` sends the calls of a
google-genai client made inside a rollout (and so Google ADK's ``Gemini``
model). Each call goes through the one capture path (``Coordinator.chat``)
and is recorded token-in-token-out as a chat completion is: contents become
OpenAI chat messages and the answer a ``GenerateContentResponse``
(``wires.gemini``). ``{model}`` names the model the agent asked for and is
not checked; ``modelVersion`` in the answer is the served model's name.

The credential is the ``x-goog-api-key`` header google-genai sends (or the
REST API's ``?key=`` query parameter; else ``Authorization: Bearer``).
``streamGenerateContent?alt=sse`` answers in server-sent events, written as
the tokens are generated (``server._streaming``, the stream writer every
protocol shares); without ``alt=sse`` it streams the REST API's JSON array.
Refusals are in Google's error shape (``error.code``, ``error.message``,
``error.status``, the field in a ``BadRequest`` detail), which google-genai
raises as ``ClientError`` / ``ServerError``.
"""

from __future__ import annotations

import itertools
import secrets
from typing import Any
from urllib.parse import parse_qs

import orjson
from fastapi import APIRouter

from ...coordinator import ChatResult, Coordinator
from ...errors import BadRequest
from ...types import SamplingParams
from ...wires.gemini import (
    GeminiEvents, GenerateContentRequest, chat_messages, gemini_error_body, generate_content_response,
)
from .._asgi import Receive, Send, send_body
from .._http import validate
from ._endpoint import JSON, Call, ProtocolEndpoint, Streamed, check_counts, off_loop, post_router, sampling

_VERSIONS = ("v1beta", "v1")
PATHS = tuple(
    f"{prefix}/{version}/models/{{model}}:{method}"
    for prefix in ("", "/rollouts/{rollout_id}") for version in _VERSIONS
    for method in ("generateContent", "streamGenerateContent")
)
_KEY = b"x-goog-api-key"


class GeminiProtocol:
    """Translates generateContent calls to ``Coordinator.chat`` and its results back.

    ``stream``: None answers whole; "sse" or "array" streams in that framing.
    """

    def __init__(self, coordinator: Coordinator, stream: str | None) -> None:
        self.coordinator = coordinator
        self.stream = stream
        self._prefix = secrets.token_hex(6)  # response ids: unique, not secret
        self._ids = itertools.count()

    async def answer(self, call: Call) -> tuple[bytes, bytes] | Streamed:
        coordinator = self.coordinator
        body, messages, tools, params = await off_loop(call, self._translate, call)
        response_id, model = f"{self._prefix}{next(self._ids):012x}", coordinator.model_name
        options = body.options()
        if self.stream is not None:  # written as the tokens are generated (server._streaming)
            return Streamed(lambda stream, respond: coordinator.chat(call.rollout_id, call.token, messages, tools,
                                                                     params, options, stream, respond=respond,
                                                                     off_loop=call.off_loop),
                            GeminiEvents(response_id, model, array=self.stream == "array"))

        async def respond(result: ChatResult) -> bytes:  # built before the turn is committed
            return orjson.dumps(generate_content_response(response_id, model, result))

        answer = await coordinator.chat(call.rollout_id, call.token, messages, tools, params, options,
                                        respond=respond, off_loop=call.off_loop)
        return answer, JSON

    def _translate(self, call: Call) -> tuple[GenerateContentRequest, list[dict], list[dict] | None, SamplingParams]:
        """The request validated and as chat: (body, messages, tools, sampling)."""
        body = validate(call.data, GenerateContentRequest)
        messages = chat_messages(body)
        tools = body.chat_tools()
        check_counts(self.coordinator, messages, tools, "contents", "tools")
        config = body.config
        params = sampling(self.coordinator, temperature=config.temperature, top_p=config.topP,
                          max_tokens=config.maxOutputTokens, stop=config.stopSequences, seed=config.seed,
                          max_tokens_field="generationConfig.maxOutputTokens")
        return body, messages, tools, params


class GeminiRoute:
    """One Gemini path: the ``key`` query parameter read as the ``x-goog-api-key`` header, ``alt`` choosing the
    framing (``sse``: server-sent events; ``json``, the default: one JSON answer, or the JSON array of a stream)."""

    def __init__(self, endpoints: dict[str, ProtocolEndpoint]) -> None:
        self.endpoints = endpoints  # by alt

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        alt = query.get("alt", ["json"])[-1]
        if alt not in ("json", "sse"):
            error = BadRequest(f"alt: expected 'sse' or 'json', got {alt!r:.40}", param="alt")
            body, headers = gemini_error_body(error)
            await send_body(send, 400, body, JSON, headers)
            return
        key = query.get("key")
        if key and not any(name.lower() == _KEY for name, _ in scope.get("headers", ())):
            scope = {**scope, "headers": [*scope.get("headers", ()), (_KEY, key[-1].encode("latin-1"))]}
        await self.endpoints.get(alt, self.endpoints["json"])(scope, receive, send)


def build_router(coordinator: Coordinator) -> APIRouter:
    """The Gemini paths, as plain ASGI routes (see ``_endpoint``)."""

    def endpoint(stream: str | None) -> ProtocolEndpoint:
        return ProtocolEndpoint(coordinator, GeminiProtocol(coordinator, stream).answer, gemini_error_body,
                                token_header=_KEY)

    whole = GeminiRoute({"json": endpoint(None)})
    streamed = GeminiRoute({"json": endpoint("array"), "sse": endpoint("sse")})
    return post_router((path, streamed if path.endswith(":streamGenerateContent") else whole) for path in PATHS)


__all__ = ["PATHS", "GeminiProtocol", "GeminiRoute", "build_router"]
