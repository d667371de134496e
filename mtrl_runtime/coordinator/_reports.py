"""What agents report about their rollouts: tool calls, rewards, and the end; and a rollout's state."""

from __future__ import annotations

import asyncio
import logging
import time

from mtrl_adapters.wire import CompletionReport, ModelCallReport, RewardReport, RolloutState, ToolCallReport

from ..errors import BadRequest, Conflict, RolloutNotFound
from ..roles import RoleMap
from ..tripwires import TripwireWatch
from ..types import ROLE_REWARD_PREFIX, AgentEnded, ModelCall, RewardReported, RolloutStatus, ToolCall, TrajectoryStore
from ._counters import CoordinatorCounters
from ._ends import RolloutEnds
from ._errors import client_data
from ._live import LiveRollout, LiveRollouts


_log = logging.getLogger("mtrl.coordinator")

TOOL_CALL_CHUNK = 256
"""Tool calls of one batch written per event-loop turn: a 10,000-call batch blocked the loop ~1.3 s in one piece."""


class ReportIntake:
    """The coordinator's part that records what agents report (tool calls, rewards, their end) and answers state."""

    def __init__(
        self, store: TrajectoryStore, live: LiveRollouts, ends: RolloutEnds, counters: CoordinatorCounters,
        reward_range: tuple[float, float] = (-1.0, 1.0), trips: TripwireWatch | None = None,
        roles: RoleMap | None = None,
    ) -> None:
        self.store = store
        self.live = live
        self.ends = ends
        self.counters = counters
        self.reward_range = reward_range  # advanced.reward_range: a reward outside is refused, nothing stored
        self.trips = trips  # advanced.tripwires: each recorded call is checked as it is recorded
        self.roles = roles  # advanced.policy_models as a mapping: role_rewards may name these roles

    async def record_tool_call(self, rollout_id: str, token: str | None, report: ToolCallReport) -> None:
        live = self.live.running(rollout_id, token)
        call = _tool_call(live, report)
        with client_data("tool_call"):
            await self.store.aadd_tool_call(call)
        live.note_reported([report.name])
        self.counters.count_tool_calls(live.step, 1)
        if self.trips is not None:
            self.trips.check_calls(rollout_id, [call])

    async def record_tool_calls(self, rollout_id: str, token: str | None, reports: list[ToolCallReport]) -> None:
        """Several tool calls of one rollout (an adapter's buffer), committed together, in order."""
        live = self.live.running(rollout_id, token)
        calls = [_tool_call(live, report) for report in reports]
        with client_data("calls"):
            for start in range(0, len(calls), TOOL_CALL_CHUNK):  # bounded chunks: other requests run in between
                await asyncio.gather(*(self.store.aadd_tool_call(c) for c in calls[start:start + TOOL_CALL_CHUNK]))
                if start + TOOL_CALL_CHUNK < len(calls):
                    await asyncio.sleep(0)
        live.note_reported(call.name for call in calls)
        self.counters.count_tool_calls(live.step, len(calls))
        if self.trips is not None:
            self.trips.check_calls(rollout_id, calls)

    async def record_model_calls(self, rollout_id: str, token: str | None, reports: list[ModelCallReport]) -> None:
        """A rollout's non-policy model calls, in order: stored apart from its turns, so never trained on."""
        live = self.live.running(rollout_id, token)
        calls = [ModelCall(rollout_id=rollout_id, **report.model_dump()) for report in reports]
        with client_data("calls"):
            for call in calls:
                await self.store.aadd_model_call(call)
        self.counters.model_calls_passed_through += len(calls)
        if calls and live.turns == 0:  # all passed through: policy_models likely names none of the agent's models
            self.counters.rollouts_with_no_policy_call += 1
            if self.counters.rollouts_with_no_policy_call == 1:
                _log.warning(
                    "mtrl: rollout %s made %d model call(s) of %s and none to the policy, so it has nothing to train "
                    "on; check that policy_models (advanced.policy_models or @rollout(policy_models=...)) names the "
                    "model id the agent's policy client calls", rollout_id, len(calls),
                    sorted({c.model or "?" for c in calls}),
                )

    async def request_end(self, rollout_id: str, token: str | None, status: RolloutStatus) -> bool:
        """SageMaker compat: the agent ends its trajectory and reports its reward after; False if ended now.

        SageMaker's feedback client completes a trajectory, then reports its
        reward; the rollout stays live until the reward comes (or the executor
        ends it), so the trainer never takes it without its reward. A rollout
        that has its reward already ends at once.
        """
        self.live.running(rollout_id, token)
        return not await self.ends.observe(rollout_id, AgentEnded(status, awaits_reward=True))

    def requested_end(self, rollout_id: str) -> RolloutStatus | None:
        """The end a live rollout's agent asked for and that still waits for the reward (SageMaker compat)."""
        live = self.live.get(rollout_id)
        return live.life.awaiting_reward if live is not None else None

    async def report_reward(self, rollout_id: str, token: str | None, report: RewardReport) -> None:
        """Record ``update_reward``. Repeating a report is fine; changing it after the end is not.

        A refusal (out of range, more values than turns, a change after the end) reaches the agent as an error
        (``RolloutError``), and is counted (``rewards_refused``); the run's first is logged with its reason, so
        that a training run's output says so even when the agent swallows the error.
        """
        try:
            await self._report_reward(rollout_id, token, report)
        except (BadRequest, Conflict) as exc:
            self.counters.rewards_refused += 1
            if self.counters.rewards_refused == 1:
                _log.warning("mtrl: rollout %s: its reward report was refused: %s (later refusals are counted as "
                             "rewards_refused)", rollout_id, exc.message)
            raise

    async def _report_reward(self, rollout_id: str, token: str | None, report: RewardReport) -> None:
        live = self.live.get(rollout_id)
        if live is None:
            stored = self.live.ended(rollout_id, token)
            if (stored.reward, stored.turn_rewards) == (report.reward, _tuple(report.turn_rewards)) and not stored.reward_defaulted:
                return
            raise Conflict(
                f"rollout {rollout_id!r} has ended with reward {stored.reward if stored.turn_rewards is None else list(stored.turn_rewards)}; "
                f"a different reward ({report.reward if report.turn_rewards is None else report.turn_rewards}) is refused",
                param="reward",
            )
        self.live.check_token(rollout_id, live.token_hash, token)
        self._check_range(report)  # after the token: a stranger learns nothing of the range
        if report.turn_rewards is not None and len(report.turn_rewards) > live.turns:
            raise BadRequest(
                f"turn_rewards has {len(report.turn_rewards)} values but rollout {rollout_id!r} has {live.turns} turns",
                param="turn_rewards",
            )
        metrics = {**report.metrics, **self._role_metrics(rollout_id, report)}
        with client_data("reward"):
            await self.store.aset_reward(rollout_id, report.reward, _tuple(report.turn_rewards), metrics)
        await self.ends.observe(rollout_id, RewardReported())

    def _role_metrics(self, rollout_id: str, report: RewardReport) -> dict[str, float]:
        """``role_rewards`` as the metrics ``role_reward/<role>`` (``types.Rollout.role_rewards``); a role this run
        does not have, or an agent's own metric under that prefix, is a 400 naming it (nothing recorded)."""
        taken = sorted(name for name in report.metrics if name.startswith(ROLE_REWARD_PREFIX))
        if taken:
            raise BadRequest(f"metrics[{taken[0]!r}]: names under {ROLE_REWARD_PREFIX!r} hold role rewards; report "
                             "them as role_rewards={role: reward}, or rename the metric", param="metrics")
        if report.role_rewards is None:
            return {}
        known = self.roles.roles if self.roles is not None else ()
        unknown = sorted(set(report.role_rewards) - set(known))
        if unknown:
            raise BadRequest(
                f"role_rewards names the role {unknown[0]!r}, which rollout {rollout_id!r}'s run does not have "
                + (f"(its roles: {list(known)!r}, advanced.policy_models)" if known else
                   "(advanced.policy_models names no roles: map roles to model ids to train one adapter per role)")
                + "; nothing was recorded", param="role_rewards")
        return {f"{ROLE_REWARD_PREFIX}{role}": value for role, value in report.role_rewards.items()}

    def _check_range(self, report: RewardReport) -> None:
        """A reward outside ``advanced.reward_range`` is a 400 naming the value and the range."""
        low, high = self.reward_range
        values = [("reward", report.reward)] if report.turn_rewards is None else [
            (f"turn_rewards[{i}]", r) for i, r in enumerate(report.turn_rewards)
        ]
        values += [(f"role_rewards[{role!r}]", r) for role, r in (report.role_rewards or {}).items()]
        for name, value in values:
            if value is not None and not low <= value <= high:
                self.counters.reward_out_of_range += 1
                raise BadRequest(
                    f"{name}: {value!r} is outside this run's reward range [{low:g}, {high:g}] "
                    "(advanced.reward_range); nothing was recorded",
                    param=name,
                )

    async def complete(self, rollout_id: str, token: str | None, report: CompletionReport) -> RolloutState:
        """The agent says how it ended; a repeated report of the same end is accepted."""
        live = self.live.get(rollout_id)
        if live is None:
            stored = self.live.ended(rollout_id, token)
            if stored.status.value != report.status:
                raise Conflict(
                    f"rollout {rollout_id!r} already ended as {stored.status.value}; cannot end it as {report.status}",
                    param="status",
                )
            return self.state(rollout_id)
        self.live.check_token(rollout_id, live.token_hash, token)
        live.agent_flags.update(report.flags)  # written with the rollout's end (``_ends``)
        live.wire_tool_calls |= report.tool_calls_from_wire
        await self.ends.observe(rollout_id, AgentEnded(RolloutStatus(report.status), report.error))
        return self.state(rollout_id)

    def state(self, rollout_id: str) -> RolloutState:
        rollout = self.store.get_rollout(rollout_id, with_turns=False)
        if rollout is None:
            raise RolloutNotFound(f"unknown rollout id {rollout_id!r}", param="rollout_id")
        return RolloutState(
            rollout_id=rollout.id,
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
        self.live.check_token(rollout_id, stored_hash, token)
        return self.state(rollout_id)


def _tool_call(live: LiveRollout, report: ToolCallReport) -> ToolCall:
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
        source=report.source,
    )


def _tuple(values: list[float] | None) -> tuple[float, ...] | None:
    return None if values is None else tuple(values)


__all__ = ["ReportIntake"]
