"""The coordinator: live rollouts, their tokens, the capture of every model call, and each rollout's end.

The HTTP routes and the rollout dispatcher call this object and nothing
behind it (the ``RolloutCoordinator`` protocol in ``types`` is what they may
rely on). It is composed of collaborators, each owning its own state:

- ``LiveRollouts`` (``_live``): creation, secret tokens, lookup, and each
  live rollout's state machine (``_lifecycle.RolloutLife``);
- ``CallCapture`` (``_capture``): model calls, each attributed one committed
  as a turn before it is answered; their prompts and replies in the chat
  format (``_rendering.CallRendering``), their checks (``_call_checks``);
- ``ReportIntake`` (``_reports``): tool calls, rewards, the agent's own end,
  a rollout's state;
- ``ChatStream`` (``_stream``): one streamed call's text as it is decoded,
  and its hang-up;
- ``RolloutEnds`` (``_ends``): the one place an end is decided (by the state
  machine, from typed events) and written;
- ``ReferenceClient`` (``_reference``): inside ``reference_side``, new
  rollouts' calls go to a reference model's own endpoint and are recorded
  without token ids (an evaluation's reference side; never trained);
- ``CoordinatorCounters`` (``_counters``): what they all count, one named
  field per event, shared with the server as ``Coordinator.counters``.

A rollout leaves memory when it ends, so memory stays bounded however many
rollouts a run makes; later lookups read the store.
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Sequence, TypeVar, overload

import httpx

from mtrl_adapters.wire import CompletionReport, ModelCallReport, RewardReport, RolloutState, ToolCallReport

from ..chat import ChatRenderer
from ..chat.formats import resolve_format
from ..config import MtrlConfig, ServerConfig
from ..run_folder import RunFolder
from ..store import hash_token
from ..tripwires import Trip, TripwireWatch
from ..types import (
    Abandoned,
    AttributionBroken,
    ChatOptions,
    ExecutorEnded,
    MixesBaseRows,
    NamesServedModel,
    PolicyEngine,
    Rollout,
    RolloutEvent,
    RolloutHandle,
    RolloutStatus,
    SamplingParams,
    Task,
    TrajectoryStore,
)
from ._capture import CallCapture, ChatResult, PolicyCall, Respond
from ._counters import CoordinatorCounters
from ._drift import DriftMeter
from ._ends import RolloutEnds
from ._lifecycle import Ending, RolloutLife, deadline_error
from ._live import LiveRollouts, VerifiedToken
from ._owner import FIX, STALE_HEADER_FLAG, StaleTrajectoryHeader
from ._reference import ReferenceClient, ReferenceModel, check_reference
from ._reports import ReportIntake
from ._stream import ChatStream, StreamClosed


T = TypeVar("T")


class Coordinator:
    """Creates rollouts, serves and records their model calls, takes their reports and ends them."""

    def __init__(self, engine: PolicyEngine, store: TrajectoryStore, config: MtrlConfig | None = None) -> None:
        self.engine = engine
        self.store = store
        self.config = config or MtrlConfig()
        self.counters = CoordinatorCounters()
        core = self.config.core
        self.default_sampling = core.sampling_params.to_params()
        self.max_tokens_cap = max(core.sampling_params.max_tokens, core.val_sampling_params.max_tokens)
        self._live = LiveRollouts(store, self.counters, core.max_turns)
        chat_format = resolve_format(engine.tokenizer, self.config.advanced.chat_format, core.model)
        self._capture = CallCapture(
            engine, store, self._live, self.counters, chat_format, self.config.advanced.history_training,
            default_seed=self.default_sampling.seed,
            background_models=frozenset(self.config.advanced.server.background_models),
            roles=self.config.advanced.role_map,
        )
        self._drift = DriftMeter(engine.tokenizer, self._capture.renderer.template, chat_format)
        tripwires = self.config.advanced.tripwires
        self._trips = TripwireWatch(tripwires, RunFolder(core.run_dir).tripwires) if tripwires.enabled else None
        self._ends = RolloutEnds(store, self._live, self.counters, self.config.advanced.default_reward, self._trips)
        self._reports = ReportIntake(store, self._live, self._ends, self.counters, self.config.advanced.reward_range,
                                     self._trips, roles=self.config.advanced.role_map)
        self._reference: ReferenceClient | None = None  # set inside ``reference_side``

    # ------------------------------------------------------------------ what the server shows
    @property
    def model_name(self) -> str:
        return self.config.core.model

    @property
    def served_model(self) -> str:
        """What the engine actually serves (the scripted double names its script), for /health."""
        return self.engine.served_model if isinstance(self.engine, NamesServedModel) else self.config.core.model

    @property
    def engine_name(self) -> str:
        return self.engine.name

    @property
    def tokenizer(self) -> Any:
        """The tokenizer replies are decoded with (for OpenAI ``logprobs`` token strings)."""
        return self.engine.tokenizer

    @property
    def renderer(self) -> ChatRenderer:
        """The chat renderer (with the run's chat format) that turns messages into the ids the engine sees."""
        return self._capture.renderer

    def template_drift(self, rollouts: Sequence[Rollout]) -> float:
        """The fraction of ``rollouts``' trained tokens that differ from the deployment rendering (``MeasuresTemplateDrift``).

        Safe to call from another thread (``_drift.DriftMeter``); measured on at most 32 of them, evenly spaced.
        """
        return self._drift.measure(rollouts)

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    @property
    def server_config(self) -> ServerConfig:
        return self.config.advanced.server

    # ------------------------------------------------------------------ rollouts
    def create_rollout(
        self, task: Task, group_id: str | None = None, *, step: int | None = None, max_turns: int | None = None,
        base_model: bool = False, seed: int | None = None,
    ) -> RolloutHandle:
        """Register a rollout (durably) and return its id and token. Thread-safe.

        ``base_model``: its calls are answered with the engine's adapter switched off (policy version 0),
        beside rollouts that use it; the engine must mix such rows (``types.MixesBaseRows``).
        ``seed``: what its calls sample with when they name no seed (``CallCapture._seed``)."""
        if base_model and not (isinstance(self.engine, MixesBaseRows) and self.engine.mixes_base_rows()):
            raise ValueError(f"base_model: engine {self.engine_name!r} cannot serve the base model beside its "
                             "adapter (it holds none it can switch off per row)")
        version = 0 if base_model else self.engine.policy_version
        handle = self._live.create(task, group_id, version, step=step, max_turns=max_turns,
                                   reference=self._reference, base_model=base_model, seed=seed)
        if self._trips is not None:
            self._trips.open(handle.rollout_id, task)
        return handle

    def tripwire_trips(self, rollout_id: str) -> tuple[Trip, ...]:
        """The tripwires an ended rollout tripped, with their evidence (``types.RecordsTrips``)."""
        return self._trips.trips(rollout_id) if self._trips is not None else ()

    @asynccontextmanager
    async def reference_side(
        self, reference: ReferenceModel, api_key: str | None = None, transport: httpx.AsyncBaseTransport | None = None
    ) -> AsyncIterator[ReferenceClient]:
        """Rollouts created inside are answered by ``reference``'s endpoint, not the policy (``_reference``).

        The endpoint is checked first (``ConnectionError`` naming the URL when it cannot be reached or refuses
        the key). Like ``evaluation.base_policy``, it holds for the whole coordinator: run no other rollouts meanwhile.
        """
        if self._reference is not None:
            raise RuntimeError("reference_side: a reference side is already open on this coordinator")
        client = ReferenceClient(reference, api_key, transport)
        try:
            await client.check()
            self._reference = client
            yield client
        finally:
            self._reference = None
            await client.aclose()

    def check_access(self, rollout_id: str, token: str | None) -> None:
        """401/403/404 unless ``token`` is ``rollout_id``'s own (checked before a route reads its body)."""
        self._live.check_access(rollout_id, token)

    def live_rollout_ids(self) -> list[str]:
        return self._live.ids()

    def token_hash(self, rollout_id: str) -> str | None:
        """The sha256 hex of ``rollout_id``'s token, live or ended (None: unknown); keys SageMaker trajectory MACs."""
        live = self._live.get(rollout_id)
        return live.token_hash if live is not None else self.store.token_hash(rollout_id)

    def recorded(self, rollout_id: str, with_turns: bool = True) -> Rollout | None:
        """The rollout as the store holds it (turns and tool calls included unless ``with_turns`` is False)."""
        return self.store.get_rollout(rollout_id, with_turns=with_turns)

    # ------------------------------------------------------------------ model calls
    @overload
    async def chat(
        self, rollout_id: str | None, token: str | None, messages: list[Mapping[str, Any]],
        tools: list[Mapping[str, Any]] | None, sampling: SamplingParams, options: ChatOptions | None = None,
        stream: ChatStream | None = None, *, off_loop: bool = False,
    ) -> ChatResult: ...

    @overload
    async def chat(
        self, rollout_id: str | None, token: str | None, messages: list[Mapping[str, Any]],
        tools: list[Mapping[str, Any]] | None, sampling: SamplingParams, options: ChatOptions | None = None,
        stream: ChatStream | None = None, *, respond: Callable[[ChatResult], Awaitable[T]], off_loop: bool = False,
    ) -> T: ...

    async def chat(
        self,
        rollout_id: str | None,
        token: str | None,
        messages: list[Mapping[str, Any]],
        tools: list[Mapping[str, Any]] | None,
        sampling: SamplingParams,
        options: ChatOptions | None = None,
        stream: ChatStream | None = None,
        *,
        respond: Respond | None = None,
        off_loop: bool = False,
    ) -> Any:
        """Serve one chat completion; an attributed call is recorded before this returns.

        ``respond`` builds the caller's answer from the ``ChatResult`` (returned as it is without one) before
        the turn is committed, so a call whose answer cannot be written records nothing; ``stream`` receives
        the completion's text as it is decoded (``_stream``: what a hang-up stops); ``off_loop``: a large
        request, its messages and prompt prepared on a worker thread (``_capture``). A call under a run-wide
        credential refused for its stale trajectory header (``_owner``) first ends the rollouts whose replies it
        proves reached another agent.
        """
        call = PolicyCall(rollout_id, token, messages, tools, sampling, options, stream, respond, off_loop)
        try:
            return await self._capture.chat(call)
        except StaleTrajectoryHeader as refused:
            for implicated in refused.implicated:
                reason = (f"a reply of this rollout reached an agent that names rollout {rollout_id!r} "
                          f"(a call carried its tool-call ids under that rollout's trajectory header); {FIX}")
                await self.end(implicated, AttributionBroken(reason, STALE_HEADER_FLAG))
            raise

    # ------------------------------------------------------------------ reports
    async def record_tool_call(self, rollout_id: str, token: str | None, report: ToolCallReport) -> None:
        await self._reports.record_tool_call(rollout_id, token, report)

    async def record_tool_calls(self, rollout_id: str, token: str | None, reports: list[ToolCallReport]) -> None:
        """Several tool calls of one rollout (an adapter's buffer), committed together, in order."""
        await self._reports.record_tool_calls(rollout_id, token, reports)

    async def record_model_calls(self, rollout_id: str, token: str | None, reports: list[ModelCallReport]) -> None:
        """A rollout's non-policy model calls (passed through to their own endpoints): recorded, never trained on."""
        await self._reports.record_model_calls(rollout_id, token, reports)

    async def report_reward(self, rollout_id: str, token: str | None, report: RewardReport) -> None:
        """Record ``update_reward``. Repeating a report is fine; changing it after the end is not."""
        await self._reports.report_reward(rollout_id, token, report)

    async def complete(self, rollout_id: str, token: str | None, report: CompletionReport) -> RolloutState:
        """The agent's side reports how the agent ended; a repeated report of the same end is accepted."""
        return await self._reports.complete(rollout_id, token, report)

    async def request_end(self, rollout_id: str, token: str | None, status: RolloutStatus) -> bool:
        """SageMaker compat: end once the reward is in; False when the rollout ended now (it had its reward)."""
        return await self._reports.request_end(rollout_id, token, status)

    def requested_end(self, rollout_id: str) -> RolloutStatus | None:
        return self._reports.requested_end(rollout_id)

    def state(self, rollout_id: str) -> RolloutState:
        return self._reports.state(rollout_id)

    def authorized_state(self, rollout_id: str, token: str | None) -> RolloutState:
        return self._reports.authorized_state(rollout_id, token)

    # ------------------------------------------------------------------ the end (trusted callers)
    async def end(self, rollout_id: str, event: RolloutEvent) -> bool:
        """Feed an end event (the dispatcher, the executor, a deadline); True if it ended the rollout now."""
        return await self._ends.observe(rollout_id, event)

    async def settle_ends(self, timeout_s: float = 60.0) -> list[str]:
        """Wait up to ``timeout_s`` until every rollout end decided so far is in the store (before the server's
        loop stops); returns the rollouts whose end is still not written."""
        return await self._ends.settle(timeout_s)

    async def abandon_idle(self, ttl_s: float) -> list[str]:
        """End ``abandoned`` every live rollout with no call or report for ``ttl_s`` seconds (kept in the store)."""
        ended = []
        for rollout_id in self._live.idle_since(time.monotonic() - ttl_s):
            if await self.end(rollout_id, Abandoned(ttl_s)):
                ended.append(rollout_id)
        return ended

    async def finish(self, rollout_id: str, status: RolloutStatus, error: str | None = None) -> bool:
        """End a rollout with what its executor saw (``ExecutorEnded``); False if it had ended."""
        return await self.end(rollout_id, ExecutorEnded(status, error))


__all__ = [
    "ChatResult",
    "ChatStream",
    "Coordinator",
    "CoordinatorCounters",
    "Ending",
    "ReferenceClient",
    "ReferenceModel",
    "RolloutHandle",
    "RolloutLife",
    "StreamClosed",
    "VerifiedToken",
    "check_reference",
    "deadline_error",
    "hash_token",
]
