"""OpenAI chat completions: ``POST /v1/chat/completions`` and ``POST /rollouts/{id}/v1/chat/completions``.

Every model call of most agents comes here. It runs on the shared
``ProtocolEndpoint`` like every other protocol (attribution before the
body, the body read within the server's limits, errors in the protocol's
shape); chat completions is the chat shape itself, so the request's
validated message dicts go to ``Coordinator.chat`` as they are (the
coordinator normalizes them, and stores them so) and the answer is
``wires.openai_chat``'s ``chat.completion`` or its chunk events, built
before the turn is committed. A body over ``OFF_LOOP_BYTES`` is decoded,
checked and turned into its prompt on a worker thread.
"""

from __future__ import annotations

import itertools
import secrets
from typing import Any

from fastapi import APIRouter

from ...coordinator import Coordinator
from ...errors import BadRequest
from ...types import ChatOptions, ChatResult, SamplingParams
from ...wires.openai_chat import ChatCompletionRequest, ChunkEvents, completion_json, error_body
from .._http import validate
from ._endpoint import JSON, Call, ProtocolEndpoint, Streamed, check_totals, off_loop, post_router

PATH = "/v1/chat/completions"
ROLLOUT_PATH = "/rollouts/{rollout_id}/v1/chat/completions"
PATHS = (PATH, ROLLOUT_PATH)
_ROLLOUT_PREFIX = "/rollouts/"
_PLAIN_OPTIONS = 64  # distinct (model, token ids) options kept by one endpoint; a client names few models


def chat_path_rollout(path: str) -> str | None:
    """``""`` for the unattributed chat path, the rollout id for a rollout's chat path, else None."""
    if path == PATH:
        return ""
    if path.startswith(_ROLLOUT_PREFIX) and path.endswith(PATH):
        rollout_id = path[len(_ROLLOUT_PREFIX) : -len(PATH)]
        if rollout_id and "/" not in rollout_id:
            return rollout_id
    return None


class ChatProtocol:
    """Answers chat completion calls through ``Coordinator.chat``."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        # completion ids: unique, not secret (no system entropy per call)
        self._id_prefix = "chatcmpl-" + secrets.token_hex(6)
        self._ids = itertools.count()
        self._plain_options: dict[tuple[str | None, bool], ChatOptions] = {}

    def options(self, body: ChatCompletionRequest) -> ChatOptions:
        """``body.options()``. Most calls name no tool choice (or ``auto``) and no template variables: theirs is one value per
        (model, token ids asked), made once (at most ``_PLAIN_OPTIONS`` kept; ``ChatOptions`` is frozen) instead of
        per call, where building it cost as much as the rest of the route's own checks."""
        if body.tool_choice not in (None, "auto") or body.chat_template_kwargs:
            return body.options()
        key = (body.model, body.wants_token_ids or body.wants_logprobs)
        options = self._plain_options.get(key)
        if options is None:
            options = body.options()
            if len(self._plain_options) < _PLAIN_OPTIONS:
                self._plain_options[key] = options
        return options

    async def answer(self, call: Call) -> tuple[bytes, bytes] | Streamed:
        coordinator = self.coordinator
        body, messages, tools, params = await off_loop(call, self._translate, call)
        cid = f"{self._id_prefix}{next(self._ids):012x}"
        model = body.model or coordinator.model_name
        tokenizer = coordinator.tokenizer
        options = self.options(body)
        if body.stream:  # written as the tokens are generated (server._streaming)
            return Streamed(lambda stream, respond: coordinator.chat(call.rollout_id, call.token, messages, tools,
                                                                     params, options, stream, respond=respond,
                                                                     off_loop=call.off_loop),
                            ChunkEvents(cid, model, tokenizer, body))

        async def respond(result: ChatResult) -> bytes:  # built before the turn is committed
            return completion_json(cid, model, tokenizer, body, result)

        answer = await coordinator.chat(call.rollout_id, call.token, messages, tools, params, options,
                                        respond=respond, off_loop=call.off_loop)
        return answer, JSON

    def _translate(self, call: Call) -> tuple[ChatCompletionRequest, list[dict[str, Any]], list[dict] | None,
                                              SamplingParams]:
        """The request validated and within the server's limits: (body, messages, tools, sampling)."""
        coordinator = self.coordinator
        body = validate(call.data, ChatCompletionRequest)
        # the request's own message dicts (validated): the coordinator normalizes them, and stores them so
        messages = call.data["messages"]
        _check_limits(coordinator.server_config, body)
        params = body.sampling(coordinator.default_sampling, coordinator.max_tokens_cap,
                               coordinator.server_config.max_tokens_over_cap)
        # tools are stored as given, so as validated (defaults filled, nulls dropped)
        tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools and body.tool_choice != "none" else None
        return body, messages, tools, params


def _check_limits(cfg: Any, body: ChatCompletionRequest) -> None:
    """The server's limits on the request's own messages (``cfg``: its settings), in one pass: their count and the
    tools' (``check_totals``), each message's tool calls (``max_tool_calls``) and its content, text parts together,
    within ``max_string_chars``; a 400 naming the message's field, the count and the limit."""
    check_totals(cfg, len(body.messages), body.tools, "messages", "tools", translated=False)
    calls_limit, chars_limit = cfg.max_tool_calls, cfg.max_string_chars
    for i, message in enumerate(body.messages):
        calls = message.tool_calls
        if calls and len(calls) > calls_limit:
            raise BadRequest(
                f"messages[{i}].tool_calls: {len(calls)} tool calls in one message; the limit is {calls_limit} "
                "(advanced.server.max_tool_calls)", param=f"messages.{i}.tool_calls",
            )
        content = message.content
        size = len(content) if isinstance(content, str) else sum(len(str(p.get("text", ""))) for p in content or [])
        if size > chars_limit:
            raise BadRequest(f"messages[{i}].content: {size} characters; the limit is {chars_limit}",
                             param=f"messages.{i}.content")


def build_router(coordinator: Coordinator) -> APIRouter:
    """Both chat completion paths, as plain ASGI routes (see ``_endpoint``)."""
    endpoint = ProtocolEndpoint(coordinator, ChatProtocol(coordinator).answer, error_body)
    return post_router((path, endpoint) for path in PATHS)


__all__ = ["PATH", "PATHS", "ROLLOUT_PATH", "ChatProtocol", "build_router", "chat_path_rollout"]
