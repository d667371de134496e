"""Ending rollouts: an event goes to the rollout's state machine; the Ending it returns is written here.

This is the one place a rollout's final status, its default reward and its
end-of-rollout flags reach the store. The write runs as its own task, so an
end once decided always lands: a caller cancelled while it waits (a run
stopping, a step's collection torn down) does not stop it, a store error while
the flags are written still ends the rollout (``failed``, naming the error)
before it propagates, and an event that arrives while another's end is being
written returns only once that end is in the store (the dispatcher reads the
row next). ``settle`` waits for every write in progress (a stack closing).

The write waits for the rollout's model call in flight to record its turn.
When the run stopped (``RunStopped``), that call's generation is cancelled
first (``_inflight.stop_generating``; a reference model's request too): the
completion would never be read, and on a CPU engine (or a slow endpoint) it can
take minutes, during which the stop looked hung.
"""

from __future__ import annotations

import asyncio
import logging

from ..tripwires import TRIPWIRE_ZEROED, TripwireWatch, trip_metrics, unreported_calls
from ..types import RolloutEvent, RolloutStatus, RunStopped, TrajectoryStore
from ._counters import CoordinatorCounters
from ._inflight import stop_generating
from ._lifecycle import Ending
from ._live import LiveRollout, LiveRollouts

_log = logging.getLogger("mtrl.coordinator")

UNRECORDED_TOOLS_FIX = (
    "the agent ran tool calls the model asked for, but its adapter reported none of them: "
    "Strands: an Agent built before the rollout opened (at import, say) gets no hooks; build the Agent inside "
    "the decorated function, or with mtrl_adapters.strands.agent_factory(...), or attach(agent) "
    "(or Agent(hooks=[MtrlHooks()])); LangGraph/LangChain: pass mtrl_adapters.langgraph's callbacks; "
    "OpenAI Agents SDK: Runner.run(..., hooks=mtrl_adapters.openai_agents.MtrlRunHooks()); "
    "your own tool loop: mtrl_adapters.record_tool_call(...); an agent on another host: post them to "
    "/rollouts/{id}/tool_calls"
)
UNSENT_TOOLS_CAUSE = (
    "the rollout ended before its agent reported its end (the run stopped, its deadline passed, the agent was "
    "cancelled or interrupted, or its process died), so the tool calls not sent by then were lost: the adapters "
    "(Strands' hooks, LangGraph's callbacks, the OpenAI Agents SDK's MtrlRunHooks) and record_tool_call send each "
    "call as it ends, so these are calls whose send was in flight at that instant, a LangGraph call that failed "
    "and still waited for the text the model read, or calls nothing captured; an agent whose rollouts are flagged "
    "when they end normally captures no tool calls, and the fix for that is logged with the first such rollout"
)


class RolloutEnds:
    """Feeds end events to live rollouts and records the end the first decisive one produces."""

    def __init__(
        self, store: TrajectoryStore, live: LiveRollouts, counters: CoordinatorCounters, default_reward: float,
        trips: TripwireWatch | None = None,
    ) -> None:
        self.store = store
        self.live = live
        self.counters = counters
        self.default_reward = default_reward
        self.trips = trips  # advanced.tripwires: a tripped rollout is flagged, its reward zeroed or kept
        self._warned_unrecorded: set[bool] = set()  # each cause (by the agent's end or not) logged once per run;
        # every rollout is flagged
        self._writing: dict[str, asyncio.Task] = {}  # rollouts decided whose end is still being written

    async def observe(self, rollout_id: str, event: RolloutEvent) -> bool:
        """Feed ``event``; True when it ended the rollout (then recorded), False when it did not (or had ended).

        Either way, once it returns the rollout's end, if decided, is in the store."""
        decided = self.live.decide(rollout_id, event)
        if decided is None:
            writing = self._writing.get(rollout_id)
            if writing is not None:  # an earlier event ended it: wait until that end is written
                await asyncio.wait([writing])
            return False
        live, ending = decided
        if isinstance(event, RunStopped):  # its end waits for the call in flight: that call's generation ends now
            stop_generating(live)
        task = asyncio.ensure_future(self._write(rollout_id, live, ending))
        self._writing[rollout_id] = task
        task.add_done_callback(lambda _: self._writing.pop(rollout_id, None))
        await asyncio.shield(task)  # a cancelled caller leaves the write running to its end
        return True

    async def settle(self, timeout_s: float) -> list[str]:
        """Wait up to ``timeout_s`` until every end decided so far is written (errors were raised to the callers
        that decided them); returns the rollouts whose end is still being written (their model call in flight
        has not returned)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self._writing and (left := deadline - asyncio.get_running_loop().time()) > 0:
            await asyncio.wait(list(self._writing.values()), timeout=left)
        return sorted(self._writing)

    async def _write(self, rollout_id: str, live: LiveRollout, ending: Ending) -> None:
        """Record ``ending``: the flags and the default reward, then the final status; a store error on the way
        still ends the rollout, ``failed`` with the error named, before it propagates."""
        try:
            await self._record_flags(rollout_id, live, ending)
        except Exception as exc:
            error = (f"recording the rollout's end ({ending.status.value}) failed: {type(exc).__name__}: {exc}"
                     + (f"; it was ending with: {ending.error}" if ending.error else ""))
            await self.store.afinish_rollout(rollout_id, RolloutStatus.FAILED, error)
            self.counters.rollouts_ended[RolloutStatus.FAILED] += 1
            raise
        await self.store.afinish_rollout(rollout_id, ending.status, ending.error)
        self.counters.rollouts_ended[ending.status] += 1

    async def _record_flags(self, rollout_id: str, live: LiveRollout, ending: Ending) -> None:
        async with live.lock:  # let a call in flight finish recording its turn first
            pass
        metrics = {**live.agent_flags, **ending.flags}
        for name, value in live.agent_flags.items():  # the agent's side's flags (``mtrl_adapters._policy_rule``)
            setattr(self.counters, name, getattr(self.counters, name) + int(value))
        if live.wire_tool_calls:  # a harness: no adapter saw its tools; the conversation shows what ran
            for call in live.wire_calls():
                await self.store.aadd_tool_call(call)
                live.tool_calls_recorded += 1
                self.counters.tool_calls_from_wire += 1
        unrecorded = live.unrecorded_tool_calls
        if unrecorded:  # never silent: flagged on the rollout, counted, and said once where the user looks
            metrics["tool_calls_unrecorded"] = float(unrecorded)
            self.counters.tool_calls_unrecorded += unrecorded
            if ending.by_agent not in self._warned_unrecorded:  # the agent's end carried its adapter's reports
                self._warned_unrecorded.add(ending.by_agent)
                _log.warning("rollout %s: %d tool call(s) unrecorded; %s", rollout_id, unrecorded,
                             UNRECORDED_TOOLS_FIX if ending.by_agent else UNSENT_TOOLS_CAUSE)
        refused = live.refused_tool_calls
        if refused:  # the model called a tool its request did not declare; the agent refused it (no tool ran)
            metrics["tool_calls_undeclared"] = float(refused)
            self.counters.tool_calls_undeclared += refused
        if live.failed_results:  # the failure flags tool results carried (wires._shared: the tool-result rule)
            metrics["tool_results_failed"] = float(len(live.failed_results))
            self.counters.tool_results_failed += len(live.failed_results)
        if live.unserved_tool_calls:  # calls whose hosted tools were not offered to the policy (Responses)
            metrics["hosted_tools_unserved"] = float(live.unserved_tool_calls)
        if live.clamped_turns:  # served up to the cap below what the call asked (advanced.server.max_tokens_over_cap)
            metrics["max_tokens_clamped"] = float(live.clamped_turns)
        tripped = self._trips(rollout_id)
        metrics.update(trip_metrics(tripped))
        zero = bool(tripped) and self.trips is not None and self.trips.on_trip == "zero"
        if ending.default_reward:
            metrics["reward_defaulted"] = 1.0
            reward = 0.0 if zero else self.default_reward
            if zero:
                metrics[TRIPWIRE_ZEROED] = 1.0
            await self.store.aset_reward(rollout_id, reward, None, metrics, defaulted=True)
            self.counters.rewards_defaulted += 1
        elif zero:
            await self._zero_reward(rollout_id, metrics)
        elif metrics:
            stored = self.store.get_rollout(rollout_id, with_turns=False)
            if stored is not None:
                await self.store.aset_reward(
                    rollout_id, stored.reward, stored.turn_rewards, {**stored.metrics, **metrics}, defaulted=False
                )

    def _trips(self, rollout_id: str) -> tuple:
        """Close the rollout's tripwire watch: the answer wires read its last reply, the state wires check again."""
        if self.trips is None:
            return ()
        answer, unreported = None, []
        if self.trips.reads_turns:
            stored = self.store.get_rollout(rollout_id, with_turns=True)
            turns = sorted(stored.turns, key=lambda t: t.index) if stored is not None else []
            answer = turns[-1].completion_text if turns else None
            unreported = unreported_calls(stored) if stored is not None else []
        return self.trips.close(rollout_id, answer, unreported)

    async def _zero_reward(self, rollout_id: str, metrics: dict[str, float]) -> None:
        """``on_trip: zero``: reward 0 (each turn's, for per-turn rewards), the agent's own kept as ``agent_reward``."""
        stored = self.store.get_rollout(rollout_id, with_turns=False)
        if stored is None:
            return
        turns = None if stored.turn_rewards is None else tuple(0.0 for _ in stored.turn_rewards)
        merged = {**stored.metrics, **metrics, "agent_reward": stored.total_reward, TRIPWIRE_ZEROED: 1.0}
        await self.store.aset_reward(rollout_id, 0.0 if turns is None else None, turns, merged, defaulted=False)


__all__ = ["UNRECORDED_TOOLS_FIX", "UNSENT_TOOLS_CAUSE", "RolloutEnds"]
