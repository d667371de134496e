"""The coordinator: live rollouts, their tokens, and the capture of every model call.

The HTTP routes and the in-process dispatcher both call this object; it owns
the engine, the store, the chat renderer and, per live rollout, the
conversation state that makes token-in-token-out work. A rollout leaves
memory when it reaches a final status, so memory stays bounded however many
rollouts a run makes; later lookups read the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping

from mtrl_adapters.wire import CompletionReport, RewardReport, RolloutState, ToolCallReport

from .chat import ChatRenderer, ConversationState, PromptBuilder, normalize_messages, parse_tool_calls
from .config import MtrlConfig
from .errors import BadRequest, Conflict, EngineFailure, Forbidden, RolloutNotFound, Unauthorized
from .store import TrajectoryStore, hash_token
from .types import (
    Generation,
    GenerationRequest,
    PolicyEngine,
    Rollout,
    RolloutStatus,
    SamplingParams,
    Task,
    ToolCall,
    Turn,
)


class VerifiedToken(str):
    """A credential the server checked itself, good for one rollout (SageMaker-compat SigV4 on loopback).

    Only server code makes one, after its own check; a token read from a
    request is always a plain ``str``, so HTTP can never forge this.
    """

    rollout_id: str

    def __new__(cls, rollout_id: str) -> "VerifiedToken":
        obj = super().__new__(cls, f"verified:{rollout_id}")
        obj.rollout_id = rollout_id
        return obj


@dataclass(frozen=True)
class RolloutHandle:
    """What the creator of a rollout hands to the agent: its id and its secret token."""

    id: str
    token: str
    group_id: str
    task: Task


@dataclass(frozen=True)
class ChatResult:
    """One answered model call, ready to be written as an OpenAI response."""

    message: dict[str, Any]
    finish_reason: str
    prompt_ids: tuple[int, ...]
    generation: Generation
    completion_text: str


@dataclass
class _Live:
    """A running rollout's in-memory state (dropped when the rollout ends)."""

    rollout_id: str
    task_id: str
    group_id: str
    token_hash: str
    policy_version: int
    max_turns: int
    conversation: ConversationState | None = None
    turns: int = 0
    hit_turn_limit: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    call_turns: dict[str, int] = field(default_factory=dict)  # tool-call id -> the turn that asked for it
    requested_end: RolloutStatus | None = None  # SageMaker compat: an end asked for before the reward came


class Coordinator:
    """Creates rollouts, serves and records their model calls, and takes their reports."""

    def __init__(self, engine: PolicyEngine, store: TrajectoryStore, config: MtrlConfig | None = None) -> None:
        self.engine = engine
        self.store = store
        self.config = config or MtrlConfig()
        self.renderer = ChatRenderer(engine.tokenizer)
        self.builder = PromptBuilder(self.renderer)
        self.counters: Counter[str] = Counter()
        self._live: dict[str, _Live] = {}
        self._live_lock = threading.Lock()
        core = self.config.core
        self.default_sampling = core.sampling_params.to_params()
        self.max_tokens_cap = max(core.sampling_params.max_tokens, core.val_sampling_params.max_tokens)

    @property
    def model_name(self) -> str:
        return self.config.core.model

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    # ------------------------------------------------------------------ rollouts
    def create_rollout(
        self,
        task: Task,
        group_id: str | None = None,
        *,
        step: int | None = None,
        max_turns: int | None = None,
    ) -> RolloutHandle:
        """Register a rollout (durably) and return its id and token. Thread-safe."""
        rollout_id = "r-" + secrets.token_hex(12)
        token = secrets.token_urlsafe(32)
        group_id = group_id or "g-" + secrets.token_hex(8)
        version = self.engine.policy_version
        rollout = Rollout(
            id=rollout_id,
            task_id=task.id,
            group_id=group_id,
            policy_version=version,
            step=step,
            created_at=time.time(),
        )
        with _client_data("task"):
            self.store.put_task(task)
        self.store.create_rollout(rollout, hash_token(token))
        live = _Live(
            rollout_id=rollout_id,
            task_id=task.id,
            group_id=group_id,
            token_hash=hash_token(token),
            policy_version=version,
            max_turns=max_turns or self.config.core.max_turns,
        )
        with self._live_lock:
            self._live[rollout_id] = live
        self.counters["rollouts_created"] += 1
        return RolloutHandle(id=rollout_id, token=token, group_id=group_id, task=task)

    def _check_token(self, rollout_id: str, expected_hash: str, token: str | None) -> None:
        if isinstance(token, VerifiedToken) and token.rollout_id == rollout_id:
            return
        if not token:
            raise Unauthorized(
                f"rollout {rollout_id!r}: missing token; send 'Authorization: Bearer <rollout token>'",
                param="authorization",
            )
        if not hmac.compare_digest(hash_token(token), expected_hash):
            self.counters["auth_rejected"] += 1
            raise Forbidden(f"rollout {rollout_id!r}: the token does not belong to this rollout", param="authorization")

    def _live_rollout(self, rollout_id: str, token: str | None) -> _Live:
        """The running rollout, after checking its token; final or unknown rollouts raise."""
        with self._live_lock:
            live = self._live.get(rollout_id)
        if live is None:
            stored_hash = self.store.token_hash(rollout_id)
            if stored_hash is None:
                raise RolloutNotFound(f"unknown rollout id {rollout_id!r}", param="rollout_id")
            self._check_token(rollout_id, stored_hash, token)
            stored = self.store.get_rollout(rollout_id, with_turns=False)
            status = stored.status.value if stored is not None else "unknown"
            raise Conflict(f"rollout {rollout_id!r} has ended ({status}); it takes no more calls", param="rollout_id")
        self._check_token(rollout_id, live.token_hash, token)
        return live

    def live_rollout_ids(self) -> list[str]:
        with self._live_lock:
            return list(self._live)

    # ------------------------------------------------------------------ model calls
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
        live = self._live_rollout(rollout_id, token)
        async with live.lock:
            if rollout_id not in self._live:
                raise Conflict(f"rollout {rollout_id!r} ended while this call waited", param="rollout_id")
            if live.turns >= live.max_turns:
                live.hit_turn_limit = True
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
        self, live: _Live, messages: list[dict], tools: list, sampling: SamplingParams
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

    # ------------------------------------------------------------------ reports
    async def record_tool_call(self, rollout_id: str, token: str | None, report: ToolCallReport) -> None:
        live = self._live_rollout(rollout_id, token)
        with _client_data("tool_call"):
            await self.store.aadd_tool_call(_tool_call(live, report))
        self.counters["tool_calls"] += 1

    async def record_tool_calls(self, rollout_id: str, token: str | None, reports: list[ToolCallReport]) -> None:
        """Several tool calls of one rollout (an adapter's buffer), committed together, in order."""
        live = self._live_rollout(rollout_id, token)
        calls = [_tool_call(live, report) for report in reports]
        with _client_data("calls"):
            await asyncio.gather(*(self.store.aadd_tool_call(call) for call in calls))
        self.counters["tool_calls"] += len(calls)

    def request_end(self, rollout_id: str, token: str | None, status: RolloutStatus) -> bool:
        """SageMaker compat: note the end an agent asked for before its reward; False if it has a reward.

        SageMaker's feedback client completes a trajectory, then reports its
        reward; the rollout stays live until the reward comes (or the executor
        ends it), so the trainer never takes it without its reward.
        """
        live = self._live_rollout(rollout_id, token)
        stored = self.store.get_rollout(rollout_id, with_turns=False)
        if stored is not None and (stored.reward is not None or stored.turn_rewards is not None):
            return False
        live.requested_end = status
        return True

    def requested_end(self, rollout_id: str) -> RolloutStatus | None:
        """The end a live rollout's agent asked for and that still waits (SageMaker compat)."""
        with self._live_lock:
            live = self._live.get(rollout_id)
        return live.requested_end if live is not None else None

    async def report_reward(self, rollout_id: str, token: str | None, report: RewardReport) -> None:
        """Record ``update_reward``. Repeating a report is fine; changing it after the end is not."""
        with self._live_lock:
            live = self._live.get(rollout_id)
        if live is None:
            stored = self._ended_rollout(rollout_id, token)
            if (stored.reward, stored.turn_rewards) == (report.reward, _tuple(report.turn_rewards)) and not stored.reward_defaulted:
                return
            raise Conflict(
                f"rollout {rollout_id!r} has ended with reward {stored.reward if stored.turn_rewards is None else list(stored.turn_rewards)}; "
                f"a different reward ({report.reward if report.turn_rewards is None else report.turn_rewards}) is refused",
                param="reward",
            )
        self._check_token(rollout_id, live.token_hash, token)
        if report.turn_rewards is not None and len(report.turn_rewards) > live.turns:
            raise BadRequest(
                f"turn_rewards has {len(report.turn_rewards)} values but rollout {rollout_id!r} has {live.turns} turns",
                param="turn_rewards",
            )
        with _client_data("reward"):
            await self.store.aset_reward(rollout_id, report.reward, _tuple(report.turn_rewards), dict(report.metrics))

    def _ended_rollout(self, rollout_id: str, token: str | None) -> Rollout:
        stored_hash = self.store.token_hash(rollout_id)
        if stored_hash is None:
            raise RolloutNotFound(f"unknown rollout id {rollout_id!r}", param="rollout_id")
        self._check_token(rollout_id, stored_hash, token)
        rollout = self.store.get_rollout(rollout_id, with_turns=False)
        assert rollout is not None
        return rollout

    async def complete(self, rollout_id: str, token: str | None, report: CompletionReport) -> RolloutState:
        """The agent says it is done; a repeated report of the same end is accepted."""
        with self._live_lock:
            live = self._live.get(rollout_id)
        if live is None:
            stored = self._ended_rollout(rollout_id, token)
            if stored.status.value != report.status:
                raise Conflict(
                    f"rollout {rollout_id!r} already ended as {stored.status.value}; cannot end it as {report.status}",
                    param="status",
                )
            return self.state(rollout_id)
        self._check_token(rollout_id, live.token_hash, token)
        await self.finish(rollout_id, RolloutStatus(report.status), report.error)
        return self.state(rollout_id)

    async def finish(self, rollout_id: str, status: RolloutStatus, error: str | None = None) -> bool:
        """End a rollout (trusted callers: the dispatcher, timeouts). Returns False if it had ended."""
        with self._live_lock:
            live = self._live.pop(rollout_id, None)
        if live is None:
            return False
        async with live.lock:  # let a call in flight finish recording its turn first
            pass
        stored = self.store.get_rollout(rollout_id, with_turns=False)
        metrics: dict[str, float] = {}
        if live.hit_turn_limit:
            metrics["hit_turn_limit"] = 1.0
        if stored is not None and stored.reward is None and stored.turn_rewards is None:
            metrics["reward_defaulted"] = 1.0
            await self.store.aset_reward(
                rollout_id, self.config.advanced.default_reward, None, metrics, defaulted=True
            )
            self.counters["rewards_defaulted"] += 1
        elif metrics and stored is not None:
            await self.store.aset_reward(
                rollout_id, stored.reward, stored.turn_rewards, {**stored.metrics, **metrics}, defaulted=False
            )
        changed = await self.store.afinish_rollout(rollout_id, status, error)
        self.counters[f"rollouts_{status.value}"] += 1
        return changed

    def state(self, rollout_id: str) -> RolloutState:
        rollout = self.store.get_rollout(rollout_id, with_turns=False)
        if rollout is None:
            raise RolloutNotFound(f"unknown rollout id {rollout_id!r}", param="rollout_id")
        return RolloutState(
            id=rollout.id,
            task_id=rollout.task_id,
            group_id=rollout.group_id,
            status=rollout.status.value,
            turns=self.store.count_turns(rollout_id),
            tool_calls=self.store.count_tool_calls(rollout_id),
            reward=rollout.reward,
            turn_rewards=list(rollout.turn_rewards) if rollout.turn_rewards is not None else None,
            metrics=dict(rollout.metrics),
            error=rollout.error,
        )

    def authorized_state(self, rollout_id: str, token: str | None) -> RolloutState:
        stored_hash = self.store.token_hash(rollout_id)
        if stored_hash is None:
            raise RolloutNotFound(f"unknown rollout id {rollout_id!r}", param="rollout_id")
        self._check_token(rollout_id, stored_hash, token)
        return self.state(rollout_id)


def _tool_call(live: _Live, report: ToolCallReport) -> ToolCall:
    """A reported tool call, placed on the turn whose reply asked for it (by call id) when not given."""
    turn_index = report.turn_index
    if turn_index is None:
        turn_index = live.call_turns.get(report.call_id or "", max(live.turns - 1, 0))
    return ToolCall(
        rollout_id=live.rollout_id,
        name=report.name,
        arguments=report.arguments,
        call_id=report.call_id or None,  # an empty id names no model tool call
        result=report.result,
        error=report.error,
        status=report.status,
        latency_s=report.latency_s,
        turn_index=turn_index,
        started_at=report.started_at or time.time(),
    )


@contextlib.contextmanager
def _client_data(param: str) -> Any:
    """A value a client sent that the store refuses (it validates before writing anything) is a 400."""
    try:
        yield
    except ValueError as exc:
        raise BadRequest(f"{param}: {exc}", param=param) from None


def _tuple(values: list[float] | None) -> tuple[float, ...] | None:
    return None if values is None else tuple(values)


__all__ = ["ChatResult", "Coordinator", "RolloutHandle", "VerifiedToken", "hash_token"]
