"""OpenAI Responses: ``POST /v1/responses`` and ``POST /rollouts/{id}/v1/responses``, streamed and not.

Each call goes through the one capture path (``Coordinator.chat``) and is
recorded token-in-token-out as a chat completion is: ``instructions`` become
the system message, the input items OpenAI chat messages, the answer a ``response`` object
or its events (``wires.openai_responses``). Errors are OpenAI's error shape, which the SDK reads.

``previous_response_id`` continues a stored response of the same rollout:
the new input is appended to that response's input and output (its
``instructions`` are not inherited, as on OpenAI). ``store`` (default true)
decides whether this response can be continued from; every call is recorded
for training either way. An unknown id (never stored, stored with
``store: false``, another rollout's, or one whose rollout has ended) is a 400
naming it. A streamed answer leaves as its tokens are generated
(``ResponsesEvents``).
"""

from __future__ import annotations

import secrets
from typing import Any

import orjson
from fastapi import APIRouter

from ...coordinator import Coordinator
from ...errors import BadRequest
from ...types import ChatResult, Generation, SamplingParams
from ...wires.openai_chat import error_body
from ...wires.openai_responses import ResponsesEvents, ResponsesRequest, input_messages, response_object
from .._http import validate
from ._endpoint import JSON, Call, ProtocolEndpoint, Streamed, check_counts, off_loop, post_router, sampling
from ._response_history import ResponseHistory

PATH = "/v1/responses"
ROLLOUT_PATH = "/rollouts/{rollout_id}/v1/responses"
PATHS = (PATH, ROLLOUT_PATH)


class ResponsesProtocol:
    """Translates Responses calls to ``Coordinator.chat`` and keeps the responses they may continue from."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self.history = ResponseHistory(coordinator.live_rollout_ids, per_rollout=coordinator.config.core.max_turns + 1)

    async def answer(self, call: Call) -> tuple[bytes, bytes] | Streamed:
        coordinator = self.coordinator
        body, conversation, messages, chat_tools, params = await off_loop(call, self._translate, call)
        options = body.options()
        # unguessable: in inference mode, callers sharing the API key must not continue each other's conversations
        response_id = f"resp_{secrets.token_hex(16)}"
        store = body.store is not False
        given_tools = call.data.get("tools") or []  # echoed as sent (validated above)
        model = body.model or coordinator.model_name

        def built(result: ChatResult) -> dict[str, Any]:
            reasoning = result.message.get("reasoning_content")
            reasoning_tokens = len(coordinator.renderer.encode(reasoning)) if reasoning else 0
            return response_object(response_id, model, body, params, result, store, given_tools, reasoning_tokens)

        def remember(result: ChatResult) -> None:
            if store:
                self.history.put(call.rollout_id, response_id, (*conversation, result.message))

        if body.stream:  # written as the tokens are generated (server._streaming)
            def finish(result: ChatResult) -> dict[str, Any]:
                response = built(result)
                remember(result)
                return response

            none = ChatResult({"role": "assistant", "content": None}, "stop", (), Generation((), (), "stop"), "")
            pending = {**response_object(response_id, model, body, params, none, store, given_tools, 0),
                       "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
            return Streamed(lambda stream, respond: coordinator.chat(call.rollout_id, call.token, messages, chat_tools,
                                                                     params, options, stream, respond=respond,
                                                                     off_loop=call.off_loop),
                            ResponsesEvents(pending, finish))

        async def respond(result: ChatResult) -> tuple[bytes, ChatResult]:  # built before the turn is committed
            return orjson.dumps(built(result)), result

        answer, result = await coordinator.chat(call.rollout_id, call.token, messages, chat_tools, params, options,
                                                respond=respond, off_loop=call.off_loop)
        remember(result)  # once committed: a response whose turn was not recorded cannot be continued from
        return answer, JSON

    def _translate(self, call: Call) -> tuple[ResponsesRequest, list[dict[str, Any]], list[dict[str, Any]],
                                              list[dict[str, Any]] | None, SamplingParams]:
        """The request validated and as chat: (body, conversation to keep, messages, tools, sampling)."""
        coordinator = self.coordinator
        body = validate(call.data, ResponsesRequest)
        prior: tuple[dict[str, Any], ...] = ()
        if body.previous_response_id is not None:
            found = self.history.get(call.rollout_id, body.previous_response_id)
            if found is None:
                raise BadRequest(
                    f"previous_response_id: no stored response {body.previous_response_id!r} in this rollout "
                    "(responses are kept per rollout while it runs, and only with store true)",
                    param="previous_response_id",
                )
            prior = found
        new = input_messages(body.input)
        conversation = [*prior, *new]
        messages = ([{"role": "system", "content": body.instructions}] if body.instructions else []) + conversation
        if not messages:
            raise BadRequest("input: no messages (an empty input with no instructions or previous response)", param="input")
        tools = body.chat_tools()
        check_counts(coordinator, messages, tools, "input", "tools")
        params = sampling(coordinator, temperature=body.temperature, top_p=body.top_p,
                          max_tokens=body.max_output_tokens, stop=None, seed=body.seed, max_tokens_field="max_output_tokens")
        return body, conversation, messages, None if body.tool_choice == "none" else tools, params


def build_router(coordinator: Coordinator) -> APIRouter:
    """Both Responses paths, as plain ASGI routes (see ``_endpoint``)."""
    protocol = ResponsesProtocol(coordinator)
    endpoint = ProtocolEndpoint(coordinator, protocol.answer, error_body)
    return post_router((path, endpoint) for path in PATHS)


__all__ = ["PATH", "PATHS", "ROLLOUT_PATH", "ResponsesProtocol", "build_router"]
