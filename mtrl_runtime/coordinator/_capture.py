"""Serving and capturing model calls: prompt, generation, reply, and the turn committed before the answer."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping

from ..chat import ChatRenderer, PromptBuilder, normalize_messages, parse_tool_calls
from ..errors import BadRequest, Conflict, EngineFailure
from ..types import Generation, GenerationRequest, PolicyEngine, SamplingParams, TrajectoryStore, Turn, TurnLimitHit
from ._live import LiveRollout, LiveRollouts


@dataclass(frozen=True)
class ChatResult:
    """One answered model call, ready to be written as an OpenAI response."""

    message: dict[str, Any]
    finish_reason: str
    prompt_ids: tuple[int, ...]
    generation: Generation
    completion_text: str


class CallCapture:
    """The coordinator's part that answers chat calls and records each attributed one as a turn."""

    def __init__(
        self,
        engine: PolicyEngine,
        store: TrajectoryStore,
        live: LiveRollouts,
        counters: Counter[str],
    ) -> None:
        self.engine = engine
        self.store = store
        self.live = live
        self.counters = counters
        self.renderer = ChatRenderer(engine.tokenizer)
        self.builder = PromptBuilder(self.renderer)

    async def chat(
        self,
        rollout_id: str | None,
        token: str | None,
        messages: list[Mapping[str, Any]],
        tools: list[Mapping[str, Any]] | None,
        sampling: SamplingParams,
    ) -> ChatResult:
        """Serve one chat completion; attributed calls are recorded before this returns."""
        try:
            normalized = normalize_messages(messages)
        except ValueError as exc:
            raise BadRequest(str(exc), param="messages") from None
        tools = list(tools or [])
        if rollout_id is None:
            return await self._inference(normalized, tools, sampling)
        live = self.live.running(rollout_id, token)
        async with live.lock:
            if self.live.get(rollout_id) is None:
                raise Conflict(f"rollout {rollout_id!r} ended while this call waited", param="rollout_id")
            if live.turns >= live.max_turns:
                self.live.decide(rollout_id, TurnLimitHit())
                self.counters["turn_limit_hits"] += 1
                raise Conflict(
                    f"rollout {rollout_id!r} reached max_turns={live.max_turns}; end the episode",
                    param="max_turns",
                )
            return await self._attributed_turn(live, normalized, tools, sampling)

    async def _inference(self, messages: list[dict], tools: list, sampling: SamplingParams) -> ChatResult:
        plan = self.builder.build(None, messages, tools)
        gen = await self._generate(GenerationRequest(prompt_ids=plan.prompt_ids, sampling=sampling))
        text, message, finish, _ = self._reply(gen, tools, sampling)
        self.counters["inference_calls"] += 1
        return ChatResult(message, finish, plan.prompt_ids, gen, text)

    async def _attributed_turn(
        self, live: LiveRollout, messages: list[dict], tools: list, sampling: SamplingParams
    ) -> ChatResult:
        started = time.time()
        plan = self.builder.build(live.conversation, messages, tools)
        request = GenerationRequest(
            prompt_ids=plan.prompt_ids,
            sampling=sampling,
            adapter=live.policy_version,
            rollout_id=live.rollout_id,
            turn_index=live.turns,
        )
        gen = await self._generate(request)
        text, message, finish, malformed = self._reply(gen, tools, sampling)
        if plan.break_reason is not None:
            self.counters[f"prefix_break/{plan.break_reason.value}"] += 1
        turn = Turn(
            rollout_id=live.rollout_id,
            index=live.turns,
            messages=tuple(messages),
            prompt_ids=plan.prompt_ids,
            completion_ids=gen.completion_ids,
            logprobs=gen.logprobs,
            finish_reason=gen.finish_reason,
            completion_text=text,
            tool_calls=tuple(message.get("tool_calls") or ()),
            tools=tuple(tools),
            policy_version=gen.policy_version,
            segment=plan.segment,
            break_reason=plan.break_reason,
            malformed_tool_call=malformed > 0,
            started_at=started,
            latency_s=time.time() - started,
        )
        await self.store.aadd_turn(turn)  # durable before the response is sent
        live.conversation = self.builder.advance(
            live.conversation, plan, messages, tools, gen.completion_ids, gen.finish_reason, message
        )
        for call in message.get("tool_calls") or ():
            live.call_turns[str(call.get("id"))] = turn.index
        live.turns += 1
        self.counters["turns"] += 1
        return ChatResult(message, finish, plan.prompt_ids, gen, text)

    async def _generate(self, request: GenerationRequest) -> Generation:
        try:
            return await self.engine.generate(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the engine failed: the call fails, the server keeps serving
            self.counters["engine_failures"] += 1
            raise EngineFailure(f"the policy engine failed: {type(exc).__name__}: {exc}") from exc

    def _reply(
        self, gen: Generation, tools: list, sampling: SamplingParams
    ) -> tuple[str, dict[str, Any], str, int]:
        """Decode the completion into an OpenAI assistant message; also count malformed tool calls."""
        ids = list(gen.completion_ids)
        eos = self.renderer.eos_token_ids
        while ids and ids[-1] in eos:
            ids.pop()
        text = self.renderer.decode(ids)
        for stop in sampling.stop:
            cut = text.find(stop)
            if cut >= 0:
                text = text[:cut]
        message: dict[str, Any] = {"role": "assistant", "content": text}
        finish = gen.finish_reason
        malformed = 0
        if tools:
            parsed = parse_tool_calls(text)
            message["content"] = parsed.content
            if parsed.tool_calls:
                message["tool_calls"] = parsed.tool_calls
                finish = "tool_calls"
            malformed = parsed.malformed
            self.counters["malformed_tool_calls"] += malformed
        return text, message, finish, malformed


__all__ = ["CallCapture", "ChatResult"]
