"""Checkpoints and the commit of trained steps: what makes ``resume`` lose nothing and repeat nothing.

A checkpoint is a folder ``<run_dir>/checkpoints/step-<N>/`` (N = the next
step to train) holding the policy weights and optimizer (``policy/``), the
RNG states (``rng.pt``) and ``state.json``: the step, the policy version, the
data position and the *commit records* of the steps trained since the
previous checkpoint (their rollout ids and metrics). It is written to a
temporary sibling, fsynced, and renamed into place, so it is complete or
absent; the temporaries of a write that died are removed on resume and at
the next save. ``advanced.keep_checkpoints`` (default 2) newest are kept.

The trajectory store learns that a step was trained only when a checkpoint
holding its update exists: after the rename, each commit record marks its
rollouts trained (``store.mark_trained``) and appends its metrics to the
store's history. Committing is idempotent (rollouts already marked and
metrics already logged are skipped), so a crash between the rename and the
end of the commit is repaired by committing again on resume. Steps trained
after the last checkpoint are thus never marked: their updates died with
the process, and resume trains on their rollouts again (see ``plan_resume``).
"""

from __future__ import annotations

import json
import logging
import random
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from ..run_folder import RunFolder
from ..types import TrajectoryStore
from .update import atomic_folder

log = logging.getLogger("mtrl.train")

STATE_FILE = "state.json"
RNG_FILE = "rng.pt"
POLICY_FOLDER = "policy"
COMMIT_SENTINEL = "time/step"  # every step logs it; its presence in the history marks a committed step
_NAME = re.compile(r"^step-(\d{6,})$")
_LEFTOVER = re.compile(r"^\.step-\d{6,}\.(tmp|old)-")


@dataclass(frozen=True)
class StepRecord:
    """What committing one trained step writes to the store."""

    step: int
    rollout_ids: tuple[str, ...]
    metrics: dict[str, float]


@dataclass(frozen=True)
class CheckpointState:
    """``state.json`` of a checkpoint."""

    next_step: int
    policy_version: int
    data_position: dict[str, int]
    commits: tuple[StepRecord, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CheckpointState":
        commits = tuple(StepRecord(c["step"], tuple(c["rollout_ids"]), dict(c["metrics"])) for c in data["commits"])
        return cls(int(data["next_step"]), int(data["policy_version"]), dict(data["data_position"]), commits,
                   dict(data.get("extra", {})))


class Checkpoints:
    """Writes, finds, restores and commits the checkpoints of one run folder."""

    def __init__(self, run_dir: str | Path, store: TrajectoryStore, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep: must be >= 1, got {keep}")
        self.folder = RunFolder(run_dir).checkpoints
        self.store = store
        self.keep = keep
        self.pending: list[StepRecord] = []

    def record(self, step: int, rollout_ids: Sequence[str], metrics: dict[str, float]) -> None:
        """Remember a trained step; it is committed with the next checkpoint."""
        self.pending.append(StepRecord(step, tuple(rollout_ids), dict(metrics)))

    def save(self, next_step: int, update: Any, data_position: dict[str, int], extra: dict[str, Any] | None = None) -> Path:
        """Write a checkpoint of ``update`` (weights, optimizer), then commit the pending steps."""
        state = CheckpointState(next_step, int(update.version), data_position, tuple(self.pending), extra or {})
        target = self.folder / f"step-{next_step:06d}"
        with atomic_folder(target) as tmp:
            update.save_checkpoint(tmp / POLICY_FOLDER)
            torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, tmp / RNG_FILE)
            (tmp / STATE_FILE).write_text(json.dumps(_state_json(state)), encoding="utf-8")
        self.commit(state)
        self.pending.clear()
        self._prune()
        return target

    def commit(self, state: CheckpointState) -> None:
        """Mark each recorded step's rollouts trained and log its metrics, skipping what is done."""
        logged = {step for step, _, _ in self.store.metric_history(COMMIT_SENTINEL)}
        for record in state.commits:
            untrained = [rollout_id for rollout_id in record.rollout_ids if self.store.trained_step(rollout_id) is None]
            if untrained:
                self.store.mark_trained(untrained, record.step)
            if record.step not in logged:
                self.store.log_metrics(record.step, record.metrics)
        self.store.set_meta("checkpoint", {"next_step": state.next_step, "policy_version": state.policy_version,
                                           "data_position": state.data_position})

    def latest(self) -> Path | None:
        """The newest complete checkpoint folder, or None."""
        found = sorted((int(m.group(1)), p) for p in self.folder.glob("step-*") if (m := _NAME.match(p.name)))
        return found[-1][1] if found else None

    def restore(self, update: Any, folder: Path | None = None) -> CheckpointState:
        """Load weights, optimizer and RNG of a checkpoint (default: the latest finite one) and re-commit its steps.

        A checkpoint holding a NaN or infinite weight (written before mtrl refused to write one) is moved
        aside to ``.step-<N>.nonfinite-<ns>`` (kept, never deleted) and the one before it is tried.
        """
        folder = folder or self._latest_finite(update)
        if folder is None:
            raise FileNotFoundError(f"no checkpoint under {self.folder}; nothing to resume from")
        state = CheckpointState.from_json(json.loads((folder / STATE_FILE).read_text(encoding="utf-8")))
        update.load_checkpoint(folder / POLICY_FOLDER)
        rng = torch.load(folder / RNG_FILE, weights_only=False)
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        self.commit(state)
        self.remove_leftovers()
        return state

    def _latest_finite(self, update: Any) -> Path | None:
        """The newest checkpoint whose weights are all finite, loaded into ``update`` to check them."""
        while (folder := self.latest()) is not None:
            update.load_checkpoint(folder / POLICY_FOLDER)
            if update.weights_finite():
                return folder
            aside = folder.with_name(f".{folder.name}.nonfinite-{time.time_ns()}")
            log.warning("mtrl: checkpoint %s holds non-finite weights; moved to %s, resuming from the one before",
                        folder, aside.name)
            folder.rename(aside)
        return None

    def _prune(self) -> None:
        """Keep the newest ``keep`` checkpoints; remove the temporaries a killed write left behind."""
        found = sorted((int(m.group(1)), p) for p in self.folder.glob("step-*") if (m := _NAME.match(p.name)))
        for _, path in found[: -self.keep]:
            shutil.rmtree(path, ignore_errors=True)
        self.remove_leftovers()

    def remove_leftovers(self) -> list[Path]:
        """Remove ``.step-*.tmp-*`` / ``.step-*.old-*`` folders of writes that died (one trainer per run folder)."""
        leftovers = [p for p in self.folder.glob(".step-*") if _LEFTOVER.match(p.name)]
        for path in leftovers:
            shutil.rmtree(path, ignore_errors=True)
        return leftovers


def _state_json(state: CheckpointState) -> dict[str, Any]:
    data = asdict(state)
    data["commits"] = [{"step": c.step, "rollout_ids": list(c.rollout_ids), "metrics": c.metrics} for c in state.commits]
    return data


__all__ = ["CheckpointState", "Checkpoints", "StepRecord"]
