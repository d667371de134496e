"""Bedrock Converse: ``POST /model/{modelId}/converse`` and ``/model/{modelId}/converse-stream``.

Also under ``/rollouts/{rollout_id}/...``, where ``mtrl_adapters`` sends the
calls of a botocore ``bedrock-runtime`` client made inside a rollout
(Strands' ``BedrockModel``, LangChain's ``ChatBedrockConverse``). The call is
attributed like a chat completion (the path prefix or ``x-mtrl-rollout-id``)
and carries the rollout's token as ``Authorization: Bearer``, in place of
the AWS signature, which the adapter never computes. The body is
translated (``wires.bedrock_converse``) onto ``Coordinator.chat``, the one
capture path, so the turn is recorded token-in-token-out like a chat
completion; ``modelId`` names the model the agent asked for and is not
checked. ``converse-stream`` answers in Bedrock's event-stream framing
(``wires.bedrock_converse.eventstream``), its events written as the tokens are generated
(``ConverseEvents``, by ``server._streaming``, the stream writer every
protocol shares): a client that hangs up stops the generation and no turn is
recorded.

Errors answer in the shape botocore reads (``x-amzn-ErrorType`` and a JSON
``message``): ``ValidationException`` (400, naming the field and the
value), ``AccessDeniedException`` (401/403), ``ResourceNotFoundException``,
``ConflictException`` (an ended rollout, ``max_turns``),
``ThrottlingException``, ``ModelErrorException`` (the engine failed).
"""

from __future__ import annotations

import time
from typing import Awaitable, Callable

from fastapi import APIRouter

from ...coordinator import ChatStream, Coordinator
from ...types import ChatOptions, ChatResult, SamplingParams
from ...wires import bedrock_converse as translate
from ...wires.bedrock_converse import ConverseEvents, ConverseRequest, error_body, error_type
from .._http import validate
from ._endpoint import JSON, Call, ProtocolEndpoint, Streamed, check_counts, off_loop, post_router, sampling

PATHS = (
    "/model/{model_id}/converse",
    "/model/{model_id}/converse-stream",
    "/rollouts/{rollout_id}/model/{model_id}/converse",
    "/rollouts/{rollout_id}/model/{model_id}/converse-stream",
)
class ConverseProtocol:
    """Translates one Converse call (streamed or not) onto ``Coordinator.chat`` and back."""

    def __init__(self, coordinator: Coordinator, stream: bool) -> None:
        self.coordinator = coordinator
        self.stream = stream

    async def answer(self, call: Call) -> tuple[bytes, bytes] | Streamed:
        started = time.perf_counter()
        coordinator = self.coordinator
        body, messages, tools, options, params = await off_loop(call, self._translate, call)
        if self.stream:  # written as the tokens are generated (server._streaming)
            def run(stream: ChatStream, respond: Callable[[ChatResult], Awaitable[bytes]]) -> Awaitable[bytes]:
                return coordinator.chat(call.rollout_id, call.token, messages, tools, params, options, stream,
                                        respond=respond, off_loop=call.off_loop)

            def stop_reason(result: ChatResult) -> str:
                return translate.stop_reason(result, body, coordinator.tokenizer)

            return Streamed(run, ConverseEvents(stop_reason, started))

        async def respond(result: ChatResult) -> bytes:  # built before the turn is committed
            stop = translate.stop_reason(result, body, coordinator.tokenizer)
            return translate.converse_json(result, stop, int((time.perf_counter() - started) * 1000))

        answer = await coordinator.chat(call.rollout_id, call.token, messages, tools, params, options,
                                        respond=respond, off_loop=call.off_loop)
        return answer, JSON

    def _translate(self, call: Call) -> tuple[ConverseRequest, list[dict], list[dict] | None, ChatOptions, SamplingParams]:
        """The request validated and as chat: (body, messages, tools, options, sampling)."""
        body = validate(call.data, ConverseRequest)
        messages = translate.chat_messages(body)
        tools, options = translate.chat_tools(body)
        check_counts(self.coordinator, messages, tools, "messages", "toolConfig.tools")
        inference, fields = body.inferenceConfig, body.additionalModelRequestFields
        params = sampling(
            self.coordinator,
            temperature=inference.temperature if inference else None,
            top_p=inference.topP if inference else None,
            max_tokens=inference.maxTokens if inference else None,
            stop=inference.stopSequences if inference else None,
            seed=fields.seed if fields else None,
            max_tokens_field="inferenceConfig.maxTokens",
        )
        return body, messages, tools, options, params


def build_router(coordinator: Coordinator) -> APIRouter:
    """The four Converse paths (a ``model_id`` may hold ``/``: an inference-profile or model ARN)."""
    endpoints = {
        stream: ProtocolEndpoint(coordinator, ConverseProtocol(coordinator, stream).answer, error_body)
        for stream in (False, True)
    }
    return post_router((path.replace("{model_id}", "{model_id:path}"), endpoints[path.endswith("-stream")])
                       for path in PATHS)


__all__ = ["PATHS", "ConverseProtocol", "build_router", "error_body", "error_type"]
