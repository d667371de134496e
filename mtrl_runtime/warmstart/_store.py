"""A run's stored rollouts as demonstrations: rejection-sampling fine-tuning on its successes.

The rollouts a run recorded (``mtrl collect``, or a training run's steps)
are filtered by their recorded reward (``min_reward``) and/or a strict
scorer's success (``strict``: ``fn(final_text, ground_truth)``, as
``mtrl train --strict`` takes it, successful at ``success_threshold``).
Only completed rollouts whose reward the agent reported count; rollouts of
validation, evaluation and check passes (groups ``val-``, ``eval-``,
``check-``) are left out: their tasks are held out. Every rollout left out
is counted by reason, so nothing is dropped unsaid.

The token ids are the stored ones exactly: samples are built from the
stored turns by ``algorithms.samples.build_samples`` (sequence extension,
one sample per segment), advantage 1 and loss mask 1 on the model's
completion tokens. The run must have rendered with the chat template the
policy being fine-tuned renders with (the store's ``chat_template`` meta),
or the ids would not be that model's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..algorithms.samples import build_samples
from ..chat import CHAT_TEMPLATE_META
from ..evaluation import StrictScorer
from ..run_folder import STORE_FILE, RunFolder
from ..store import open_store
from ..types import Rollout, RolloutStatus, Task
from ._demonstration import Demonstration
from ._render import ConversationRenderer

HELD_OUT_GROUPS = ("val-", "eval-", "check-")  # group ids of validation, evaluation and check passes


@dataclass(frozen=True)
class StoreSelection:
    """The rollouts kept, and how many were left out for each reason."""

    kept: tuple[Rollout, ...]
    left_out: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        reasons = ", ".join(f"{n} {why}" for why, n in sorted(self.left_out.items())) or "none"
        return f"{len(self.kept)} rollouts kept; left out: {reasons}"


def select_rollouts(
    rollouts: list[Rollout],
    tasks: dict[str, Task],
    *,
    min_reward: float | None = None,
    strict: StrictScorer | None = None,
    success_threshold: float = 1.0,
    split: str | None = None,
) -> StoreSelection:
    """The rollouts that pass every filter given (at least one of ``min_reward`` and ``strict``)."""
    if min_reward is None and strict is None:
        raise ValueError("--from-run: give --min-reward and/or --strict; fine-tuning on every rollout would "
                         "imitate the failures too")
    kept, left_out = [], Counter()
    for rollout in rollouts:
        task = tasks.get(rollout.task_id)
        why = _left_out(rollout, task, min_reward, strict, success_threshold, split)
        if why is None:
            kept.append(rollout)
        else:
            left_out[why] += 1
    return StoreSelection(tuple(kept), dict(left_out))


def _left_out(
    rollout: Rollout, task: Task | None, min_reward: float | None, strict: StrictScorer | None,
    success_threshold: float, split: str | None,
) -> str | None:
    """Why ``rollout`` is not a demonstration (None: it is one)."""
    never = never_a_demonstration(rollout.group_id, rollout.status.value)
    if never is not None:
        return never
    if task is None:
        return "of tasks the store does not hold"
    if split is not None and task.split != split:
        return f"of tasks not in split {split!r}"
    if not rollout.turns:
        return "without a model turn"
    if rollout.reward_defaulted or (rollout.reward is None and rollout.turn_rewards is None):
        return "without a reported reward"
    if min_reward is not None and rollout.total_reward < min_reward:
        return f"with reward below {min_reward:g}"
    if strict is not None and strict.score(rollout, task) < success_threshold:
        return "failed by the strict scorer"
    return None


def never_a_demonstration(group_id: str, status: str) -> str | None:
    """Why a rollout of group ``group_id`` that ended ``status`` is no demonstration whatever the filters: its task
    is held out (validation, evaluation and check passes), or it did not complete (None: it may be one)."""
    if group_id.startswith(HELD_OUT_GROUPS):
        return "of validation/evaluation passes"
    return None if status == RolloutStatus.COMPLETED.value else status


def rollout_demonstration(rollout: Rollout) -> Demonstration:
    """The stored rollout's samples: its own token ids, advantage 1 and mask 1 on every completion token."""
    samples = build_samples(rollout, [1.0] * len(rollout.turns))
    return Demonstration(name=rollout.id, group=rollout.task_id, samples=tuple(samples))


def store_demonstrations(
    run_dir: str | Path,
    renderer: ConversationRenderer,
    *,
    min_reward: float | None = None,
    strict: StrictScorer | None = None,
    success_threshold: float = 1.0,
    split: str | None = None,
) -> tuple[list[Demonstration], StoreSelection]:
    """The demonstrations of the run at ``run_dir`` (its store file) for the policy ``renderer`` renders for."""
    db = RunFolder(run_dir).store
    if not db.is_file():
        raise ValueError(f"--from-run: {str(run_dir)!r} holds no {STORE_FILE} (give a run folder of mtrl collect "
                         "or mtrl train)")
    store = open_store(db)
    try:
        _check_template(store.get_meta(CHAT_TEMPLATE_META), renderer, run_dir)
        rollouts = store.rollouts()
        tasks = {}
        for task_id in {r.task_id for r in rollouts}:
            task = store.get_task(task_id)
            if task is not None:
                tasks[task_id] = task
    finally:
        store.close()
    selection = select_rollouts(rollouts, tasks, min_reward=min_reward, strict=strict,
                                success_threshold=success_threshold, split=split)
    vocab = len(renderer.renderer.tokenizer)
    demos = []
    for rollout in selection.kept:
        demo = rollout_demonstration(rollout)
        top = max((max(s.token_ids_T) for s in demo.samples), default=0)
        if top >= vocab:
            raise ValueError(f"--from-run: rollout {rollout.id!r} holds token id {top}, past the vocabulary of "
                             f"core.model's tokenizer ({vocab}); it was recorded with another model")
        demos.append(demo)
    return demos, selection


def _check_template(recorded: Any, renderer: ConversationRenderer, run_dir: Any) -> None:
    """The run rendered with the template this policy renders with (else its ids are another model's)."""
    if not isinstance(recorded, dict):
        raise ValueError(f"--from-run: the store of {str(run_dir)!r} does not record the chat template its endpoint "
                         "rendered with; its token ids cannot be checked against core.model's (collect again)")
    ours = {"chat_format": renderer.format.name, "template": renderer.renderer.template}
    for key in ("chat_format", "template"):
        if recorded.get(key) != ours[key]:
            shown = recorded.get(key) if key == "chat_format" else "another template"
            raise ValueError(f"--from-run: the run at {str(run_dir)!r} rendered with {key} {shown!r}, core.model's "
                             f"tokenizer renders with {ours[key] if key == 'chat_format' else 'its own'}; its token "
                             "ids are not this model's: fine-tune the model that run served")


__all__ = ["HELD_OUT_GROUPS", "StoreSelection", "never_a_demonstration", "rollout_demonstration",
           "select_rollouts", "store_demonstrations"]
