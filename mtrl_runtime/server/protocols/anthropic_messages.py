"""Anthropic Messages: ``POST /v1/messages`` and ``POST /rollouts/{id}/v1/messages``, streamed and not.

Each call goes through the one capture path (``Coordinator.chat``) and is
recorded token-in-token-out as a chat completion is: the system prompt and
content blocks become OpenAI chat messages, the answer an Anthropic
``message`` or its events (``wires.anthropic_messages``). The
credential is the ``x-api-key`` header the Anthropic SDK sends (else
``Authorization: Bearer``); refusals are in Anthropic's error shape, which
the SDK reads. A streamed answer leaves as its tokens are generated
(``MessagesEvents``).
"""

from __future__ import annotations

import itertools
import secrets

import orjson
from fastapi import APIRouter

from ...coordinator import Coordinator
from ...types import ChatResult, SamplingParams
from ...wires.anthropic_messages import MessagesEvents, MessagesRequest, anthropic_error_body, chat_messages, message_object
from .._http import validate
from ._endpoint import JSON, Call, ProtocolEndpoint, Streamed, check_counts, off_loop, post_router, sampling

PATH = "/v1/messages"
ROLLOUT_PATH = "/rollouts/{rollout_id}/v1/messages"
PATHS = (PATH, ROLLOUT_PATH)


class MessagesProtocol:
    """Translates Messages calls to ``Coordinator.chat`` and its results back."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self._prefix = "msg_" + secrets.token_hex(6)  # message ids: unique, not secret
        self._ids = itertools.count()

    async def answer(self, call: Call) -> tuple[bytes, bytes] | Streamed:
        coordinator = self.coordinator
        body, messages, tools, params = await off_loop(call, self._translate, call)
        message_id, model = f"{self._prefix}{next(self._ids):012x}", body.model or coordinator.model_name

        def finish(result: ChatResult) -> dict:
            stop = _stop_sequence(coordinator, result, body.stop_sequences) if body.stop_sequences else None
            return message_object(message_id, model, result, stop)

        if body.stream:  # written as the tokens are generated (server._streaming)
            return Streamed(lambda stream, respond: coordinator.chat(call.rollout_id, call.token, messages, tools,
                                                                     params, body.options(), stream, respond=respond,
                                                                     off_loop=call.off_loop),
                            MessagesEvents(message_id, model, finish))

        async def respond(result: ChatResult) -> bytes:  # built before the turn is committed
            return orjson.dumps(finish(result))

        answer = await coordinator.chat(call.rollout_id, call.token, messages, tools, params, body.options(),
                                        respond=respond, off_loop=call.off_loop)
        return answer, JSON

    def _translate(self, call: Call) -> tuple[MessagesRequest, list[dict], list[dict] | None, SamplingParams]:
        """The request validated and as chat: (body, messages, tools, sampling)."""
        body = validate(call.data, MessagesRequest)
        messages = chat_messages(body)
        tools = [t.chat_tool() for t in body.tools] if body.tools else None
        check_counts(self.coordinator, messages, tools, "messages", "tools")
        params = sampling(self.coordinator, temperature=body.temperature, top_p=body.top_p, max_tokens=body.max_tokens,
                          stop=body.stop_sequences, seed=body.seed, max_tokens_field="max_tokens")
        if body.tool_choice is not None and body.tool_choice.type == "none":
            tools = None
        return body, messages, tools, params


def _stop_sequence(coordinator: Coordinator, result: ChatResult, stops: list[str]) -> str | None:
    """The stop sequence that ended the turn: the first one in the completion's text, when it ended on its own."""
    if result.finish_reason != "stop":
        return None
    text = coordinator.renderer.decode(list(result.generation.completion_ids))
    found = [(text.find(s), s) for s in stops if s in text]
    return min(found)[1] if found else None


def build_router(coordinator: Coordinator) -> APIRouter:
    """Both Messages paths, as plain ASGI routes (see ``_endpoint``)."""
    protocol = MessagesProtocol(coordinator)
    endpoint = ProtocolEndpoint(coordinator, protocol.answer, anthropic_error_body, token_header=b"x-api-key")
    return post_router((path, endpoint) for path in PATHS)


__all__ = ["PATH", "PATHS", "ROLLOUT_PATH", "MessagesProtocol", "build_router"]
