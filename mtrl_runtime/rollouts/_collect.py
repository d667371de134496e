"""Collecting rollouts without training: an agent over N tasks, ``group_size`` samples each, as training runs it.

``collect_rollouts`` builds the same stack training uses (engine, the run's
store, coordinator, loopback endpoint, executor), runs every task's group
concurrently through the ``Dispatcher`` (``run_group``: group ids
``collect-<n>-g<i>``, ``step`` None, so a trainer never mistakes them for a
step's batch), and returns what the store recorded. The rollouts stay in
the run's store, where ``mtrl collect`` users read them and a warm start can
take them from. With a ``reference`` (a frontier teacher behind its own
endpoint) every call of these rollouts is answered by it, through the
coordinator's reference side, as ``mtrl eval --reference-url`` runs one.
``rollout_line`` is the one-line summary ``mtrl collect``
prints per rollout.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..config import MtrlConfig
from ..coordinator import ReferenceModel
from ..types import ROLLOUT_FLAGS, PolicyEngine, Rollout, RolloutStatus, Task
from ._dispatcher import GroupResult
from ._stack import open_stack

COLLECT_RUNS_KEY = "collect_runs"  # store meta: one record per collection (group ids, task ids, when)


@dataclass(frozen=True)
class Collected:
    """What one collection recorded: the groups, in task order, and where they are stored."""

    groups: tuple[GroupResult, ...]
    store_path: Path
    seconds: float

    @property
    def rollouts(self) -> list[Rollout]:
        return [r for g in self.groups for r in g.finished]

    def counts(self) -> dict[str, int]:
        """Rollouts per final status (every status listed, zeros included)."""
        out = {s.value: 0 for s in RolloutStatus if s.is_final}
        for rollout in self.rollouts:
            out[rollout.status.value] = out.get(rollout.status.value, 0) + 1
        return out


async def collect_rollouts(
    config: MtrlConfig,
    agent_env: Any,
    tasks: Sequence[Task],
    *,
    store_path: str | Path | None = None,
    engine: PolicyEngine | None = None,
    on_rollout: Callable[[Task, Rollout], None] | None = None,
    reference: ReferenceModel | None = None,
    reference_key: str | None = None,
) -> Collected:
    """Run ``agent_env`` on every task (``core.group_size`` rollouts each, concurrently) and return them stored.

    ``store_path``: default the run folder's store (``RunFolder.store``). ``on_rollout``
    is called as each group finishes, once per rollout (for printing). ``reference``: the model that answers
    every call instead of the engine (its endpoint checked first: ``ConnectionError`` naming the URL), with the
    API key ``reference_key``.
    """
    if not tasks:
        raise ValueError("tasks: give at least one task to collect")
    path = Path(store_path) if store_path is not None else config.run_folder.store
    started = time.monotonic()
    async with open_stack(config, agent_env, path, engine=engine) as stack:
        label = f"collect-{len(stack.store.get_meta(COLLECT_RUNS_KEY, []))}"
        dispatcher = stack.dispatcher()

        async def one(index: int, task: Task) -> GroupResult:
            group = await dispatcher.run_group(f"{label}-g{index}", task)
            if on_rollout is not None:
                for rollout in group.finished:
                    on_rollout(task, rollout)
            return group

        async with contextlib.AsyncExitStack() as sides:
            if reference is not None:
                await sides.enter_async_context(stack.coordinator.reference_side(reference, reference_key))
            groups = await asyncio.gather(*(one(i, task) for i, task in enumerate(tasks)))
        record = {"label": label, "tasks": [t.id for t in tasks], "group_ids": [g.id for g in groups],
                  "group_size": config.core.group_size, "started_at": time.time()}
        stack.store.set_meta(COLLECT_RUNS_KEY, [*stack.store.get_meta(COLLECT_RUNS_KEY, []), record])
    return Collected(tuple(groups), path, time.monotonic() - started)


def rollout_line(task: Task, rollout: Rollout) -> str:
    """``task  rollout  status  turns  tool calls  reward  [flags]  [error]`` on one line.

    ``flags`` lists the coordinator's flags the rollout carries (``ROLLOUT_FLAGS``; a defaulted reward shows
    as ``(default)`` instead), such as ``tool_calls_unrecorded=2``: tool calls that ran and were not recorded.
    """
    reward = "-" if rollout.reward is None else f"{rollout.reward:.3f}"
    if rollout.reward_defaulted:
        reward += " (default)"
    tools = ", ".join(c.name for c in rollout.tool_calls[:6]) + (", ..." if len(rollout.tool_calls) > 6 else "")
    line = (f"{task.id}  {rollout.id}  {rollout.status.value}  turns={len(rollout.turns)}  "
            f"tool_calls={len(rollout.tool_calls)}{f' [{tools}]' if tools else ''}  reward={reward}")
    flags = [f"{name}={rollout.metrics[name]:g}" for name in ROLLOUT_FLAGS
             if name != "reward_defaulted" and rollout.metrics.get(name)]
    if flags:
        line += f"  flags: {', '.join(flags)}"
    if rollout.error:
        error = rollout.error.replace("\n", " ")
        line += f"  error: {error[:300]}"
    return line


__all__ = ["COLLECT_RUNS_KEY", "Collected", "collect_rollouts", "rollout_line"]
