"""Kill ``mtrl train`` mid-run with SIGKILL, resume it, and check the store: nothing lost, nothing twice.

The run checkpoints every 2 steps. It is killed while an odd step N + 1
collects rollouts: after the checkpoint before step N, and after step N was
trained but not checkpointed. The resumed run restarts at step N: step N's
rollouts (made by the checkpoint's policy) are reused, not regenerated; step
N + 1's completed rollouts (made by the lost policy of step N's update) are
discarded and regenerated; running ones are finished as interrupted. The
agent's rewards never tie within a group (``agent_with_signal``), so every
step's update runs and moves the policy version.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

import _lookup_task as lookup
from mtrl_runtime.store import SQLiteStore
from mtrl_runtime.types import RolloutStatus

TESTS = Path(__file__).parent
MAX_STEPS = 8


def _write_run(tmp: Path) -> tuple[Path, Path]:
    model = lookup.save_model(tmp / "model")
    data = tmp / "tasks.jsonl"
    data.write_text("".join(json.dumps(t) + "\n" for t in lookup.tasks()))
    cfg = lookup.config(tmp / "run", model=str(model), engine="hf", dataset=str(data), max_steps=MAX_STEPS,
                        advanced={"checkpoint_every": 2, "engine_options": {"eos_token_ids": lookup.stop_ids(lookup.build_tokenizer())}})
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, tmp / "run"


def _train(config: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "mtrl_runtime.cli", "train", str(config), "--agent", f"{TESTS / '_lookup_task.py'}:agent_with_signal",
         "--no-mlflow", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )


def _completed_rollouts(db: Path, step: int) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            return conn.execute("SELECT COUNT(*) FROM rollouts WHERE step = ? AND status = 'completed'", (step,)).fetchone()[0]
    except sqlite3.OperationalError:  # the schema is not there yet
        return 0


def _latest_checkpoint(run: Path) -> int | None:
    found = sorted(int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("step-*")) if (run / "checkpoints").is_dir() else []
    return found[-1] if found else None


def _kill_during_an_uncheckpointed_step(proc: subprocess.Popen, run: Path) -> int:
    """SIGKILL once the step after a checkpointed, trained step is collecting; returns the checkpoint's step."""
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"mtrl train ended early:\n{proc.stdout.read()}"
        latest = _latest_checkpoint(run)
        if latest is not None and latest < MAX_STEPS - 2 and _completed_rollouts(run / "trajectories.db", latest + 1) >= 3:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            return _latest_checkpoint(run)
        time.sleep(0.02)
    proc.kill()
    pytest.fail("no uncheckpointed step was seen collecting")


@pytest.mark.timeout(300)
def test_sigkill_then_resume_loses_nothing_and_trains_nothing_twice(tmp_path):
    config, run = _write_run(tmp_path)
    start = _kill_during_an_uncheckpointed_step(_train(config), run)  # 2 or 4: checkpoints every 2 steps
    killed = SQLiteStore(run / "trajectories.db")
    before = {r.id: r for r in killed.rollouts(with_turns=False)}
    # only checkpointed steps are committed: step `start` was trained, but its update died with the process
    assert [s for s, _, _ in killed.metric_history("time/step")] == list(range(start))
    assert {killed.trained_step(rid) for rid in before} <= {None, *range(start)}
    killed.close()

    resumed = _train(config, "--resume")
    out, _ = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, out

    store = SQLiteStore(run / "trajectories.db")
    try:
        rollouts = store.rollouts(with_turns=False)
        trained_at = {r.id: store.trained_step(r.id) for r in rollouts}
        (record,) = store.get_meta("resumes")
        assert record["start_step"] == start
        # step `start`'s rollouts were made by the checkpoint's policy: reused, not regenerated
        reused_before = [r for r in before.values() if r.step == start and r.status is RolloutStatus.COMPLETED]
        assert reused_before and {r.id for r in reused_before} <= set(record["reused"])
        per_group = defaultdict(list)
        for r in rollouts:
            if r.step == start and r.status is RolloutStatus.COMPLETED:
                per_group[r.group_id].append(r)
        assert all(len(g) == 8 for g in per_group.values())  # group_size: none run again
        # the next step's completed rollouts came from the lost update: discarded, never trained
        lost = {r.id for r in before.values() if r.step == start + 1 and r.status is RolloutStatus.COMPLETED}
        assert lost and lost <= set(record["discarded"])
        by_id = {r.id: r for r in rollouts}
        assert all(trained_at[i] is None for i in record["discarded"])
        assert all(by_id[i].status is RolloutStatus.INTERRUPTED for i in record["interrupted"])
        # steps continue: every step's metrics once, every trained rollout trained in its own step, once
        assert [s for s, _, _ in store.metric_history("time/step")] == list(range(MAX_STEPS))
        trained = [r for r in rollouts if trained_at[r.id] is not None]
        assert trained and all(trained_at[r.id] == r.step for r in trained)
        assert {trained_at[r.id] for r in trained} <= set(range(MAX_STEPS))
        # nothing lost: an untrained completed rollout was discarded, or its group carried no signal
        discarded = set(record["discarded"])
        groups = defaultdict(list)
        for r in rollouts:
            if r.status is RolloutStatus.COMPLETED and r.id not in discarded:
                groups[r.group_id].append(r)
        for members in groups.values():
            if any(trained_at[r.id] is None for r in members):
                assert len({r.total_reward for r in members}) == 1, [(r.id, r.total_reward, trained_at[r.id]) for r in members]
    finally:
        store.close()
