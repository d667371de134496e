"""A finished (or stopped) run as rescoring reads it: its config, and per step the groups its update saw.

The run folder's store is opened read-only (``open_store(read_only=True)``:
nothing is written, a missing file is an error, not a new store). The config
is the one the trainer recorded in the store's meta (``RUN_CONFIG_META``);
a run trained before mtrl recorded it needs the YAML it trained with.

A step's batch is rebuilt from the rollouts stored with that ``step``:
groups in batch order (group ids ``s<step>-g<index>``, then the refill
groups ``s<step>-r<k>`` dynamic sampling drew, as it drew them), each group's
completed rollouts (creation order, at most ``group_size``) as ``kept``,
and the group policy the run used replayed on the final counts to decide
whether the group was dropped. Every round of a group asks for exactly the
rollouts the last one lost, so after the last round ``completed + failed ==
group_size``: the counts the policy last decided on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from ..config import RUN_CONFIG_META, ConfigError, MtrlConfig
from ..group_policies import GROUP_POLICIES, GroupRound
from ..rollouts import GroupResult
from ..run_folder import STORE_FILE, RunFolder
from ..store import open_store
from ..types import Rollout, RolloutStatus, Task, TrajectoryStore

_GROUP_ID = re.compile(r"^s(\d+)-([gr])(\d+)$")  # a step's own groups (g), then dynamic sampling's refills (r)


@dataclass(frozen=True)
class StoredStep:
    """One trained (or collected) step: its groups as the update saw them, and what the run logged about it.

    ``groups``: ``GroupResult``s in batch order; ``rollouts``: every rollout
    of the step (what the loop's ``rollout/...`` metrics average);
    ``logged``: the step's metric history (empty when its update was never
    committed by a checkpoint); ``trained_ids``: the rollouts the store marks
    trained by this step.
    """

    step: int
    groups: tuple[GroupResult, ...]
    logged: Mapping[str, float] = field(default_factory=dict)
    trained_ids: frozenset[str] = frozenset()

    @property
    def rollouts(self) -> list[Rollout]:
        return [r for g in self.groups for r in g.finished]

    @property
    def policy_version(self) -> int:
        """The version the update trained from: logged as ``async/policy_version``; for a step never committed,
        the newest version that generated its kept rollouts (what a synchronous run trains from)."""
        if "async/policy_version" in self.logged:
            return int(self.logged["async/policy_version"])
        return max((t.policy_version for g in self.groups for r in g.kept for t in r.turns), default=0)


@dataclass(frozen=True)
class StoredRun:
    """A run folder read back: its config, tasks and steps."""

    folder: Path
    config: MtrlConfig
    config_source: str  # "store meta" or the YAML given
    tasks: Mapping[str, Task]
    steps: tuple[StoredStep, ...]


def open_run_store(folder: str | Path) -> TrajectoryStore:
    """The run folder's store, opened read-only; a clear error when the folder holds none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"run: no folder {str(folder)!r}; give the run_dir of a training run")
    path = RunFolder(folder).store
    if not path.is_file():
        raise FileNotFoundError(f"run: {str(folder)!r} holds no trajectory store ({STORE_FILE}); "
                                "give the run_dir of a training run (core.run_dir, mtrl train --run-dir)")
    return open_store(path, read_only=True)


def run_config(store: TrajectoryStore, folder: Path, given: MtrlConfig | None) -> tuple[MtrlConfig, str]:
    """The config the run recorded, else ``given``; neither: an error naming the fix."""
    if given is not None:
        return given, "given"
    recorded = store.get_meta(RUN_CONFIG_META)
    if recorded is None:
        raise ConfigError(f"run {str(folder)!r}: its store records no config (trained before mtrl recorded it); "
                          "pass the YAML it trained with (mtrl rescore RUN --config CONFIG)")
    return MtrlConfig.from_dict(recorded), "store meta"


def load_run(folder: str | Path, config: MtrlConfig | None = None) -> StoredRun:
    """Read a run folder: config, tasks, and every step's groups rebuilt from the stored rollouts."""
    folder = Path(folder)
    store = open_run_store(folder)
    try:
        cfg, source = run_config(store, folder, config)
        by_step: dict[int, dict[str, list[Rollout]]] = {}
        for rollout in store.rollouts(with_turns=True):  # creation order
            if rollout.step is not None:  # validation and collected rollouts belong to no step
                by_step.setdefault(rollout.step, {}).setdefault(rollout.group_id, []).append(rollout)
        history: dict[int, dict[str, float]] = {}
        if not by_step:
            raise ValueError(f"run {str(folder)!r}: its store holds no rollout of a training step (validation and "
                             "collected rollouts belong to none); nothing to rescore")
        for step, name, value in store.metric_history():
            history.setdefault(step, {})[name] = value
        tasks: dict[str, Task] = {}
        steps = []
        for step in sorted(by_step):
            groups = []
            for group_id in sorted(by_step[step], key=lambda g: _group_order(g, step)):
                rollouts = by_step[step][group_id]
                task = tasks.get(rollouts[0].task_id) or _task(store, rollouts[0])
                tasks[task.id] = task
                groups.append(_group(group_id, task, rollouts, cfg))
            trained = frozenset(r.id for g in groups for r in g.finished if store.trained_step(r.id) == step)
            steps.append(StoredStep(step, tuple(groups), history.get(step, {}), trained))
    finally:
        store.close()
    return StoredRun(folder, cfg, source, tasks, tuple(steps))


def _group(group_id: str, task: Task, rollouts: list[Rollout], config: MtrlConfig) -> GroupResult:
    """The group as the dispatcher formed it: completed rollouts kept unless the run's group policy dropped it."""
    size = config.core.group_size
    policy_config = config.advanced.group_policy
    completed = [r for r in rollouts if r.status is RolloutStatus.COMPLETED][:size]
    # retries_used at the cap: the policy decides on the final counts, as it did after the last round
    final = GroupRound(size, len(completed), size - len(completed), policy_config.max_retries)
    decision = GROUP_POLICIES.get(policy_config.on_failure)(final, policy_config)
    dropped = decision.action != "keep"
    return GroupResult(id=group_id, task=task, kept=() if dropped else tuple(completed),
                       finished=tuple(rollouts), dropped=dropped)


def _group_order(group_id: str, step: int) -> tuple[int, int, str]:
    """Batch order: ``s<step>-g<i>`` by i, then ``s<step>-r<k>`` by k (refill rounds append), then any other id."""
    match = _GROUP_ID.match(group_id)
    if match is None or int(match.group(1)) != step:
        return (2, 0, group_id)
    return (0 if match.group(2) == "g" else 1, int(match.group(3)), "")


def _task(store: TrajectoryStore, rollout: Rollout) -> Task:
    task = store.get_task(rollout.task_id)
    if task is None:
        raise ValueError(f"rollout {rollout.id!r} names task {rollout.task_id!r}, which the store does not hold")
    return task


__all__ = ["StoredRun", "StoredStep", "load_run", "open_run_store", "run_config"]
