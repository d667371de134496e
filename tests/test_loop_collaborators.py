"""The training loop's collaborators are typed by protocols, and tracking off is a tracker that records nothing.

``RunTracker`` (types) is what MLflow's ``Tracker`` and ``NullTracker``
satisfy; ``WeightSync`` (training) what ``SharedWeights`` and
``PushedWeights`` do; ``StepObserver`` (monitor) what the loop asks of its
monitor. A run with tracking off holds a ``NullTracker``, never None.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path

from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.monitor import DiagnosticsMonitor, StepObserver
from mtrl_runtime.tracking import NullTracker, Tracker
from mtrl_runtime.types import RunTracker


def test_the_null_tracker_is_a_run_tracker_that_records_nothing(tmp_path: Path) -> None:
    tracker = NullTracker()
    assert isinstance(tracker, RunTracker)
    assert tracker.run_id is None and tracker.tracking_uri is None
    assert tracker.log_metrics(0, {"x": 1.0}) is None and tracker.log_rollouts([], 0) is None
    assert tracker.log_artifacts(tmp_path, "adapter") is None and tracker.set_tag("k", "v") is None
    assert tracker.close("FAILED") is None
    assert list(tmp_path.iterdir()) == []  # nothing written anywhere


def test_the_mlflow_tracker_is_a_run_tracker_and_sets_tags_itself(tmp_path: Path) -> None:
    config = MtrlConfig.from_dict({"core": {"run_dir": str(tmp_path / "run")}})
    tracker = Tracker(config, run_name="tags")
    try:
        assert isinstance(tracker, RunTracker)
        tracker.set_tag("mtrl.note", "hello")
        assert tracker.client.get_run(tracker.run_id).data.tags["mtrl.note"] == "hello"
    finally:
        tracker.close()


def test_a_monitor_without_a_tracker_holds_a_null_tracker_and_still_writes_its_file(tmp_path: Path) -> None:
    config = MtrlConfig.from_dict({"core": {"run_dir": str(tmp_path / "run")}})
    monitor = DiagnosticsMonitor.for_config(config, echo=None)
    assert isinstance(monitor, StepObserver) and isinstance(monitor.tracker, NullTracker)
    for step in range(5):
        found = monitor.observe(step, {"rollout/reward/mean": 0.0, "rollout/truncated_frac": 0.0})
    assert [d.rule for d in found] == ["reward_flat_from_start"]
    [line] = (tmp_path / "run" / "diagnostics.jsonl").read_text().splitlines()
    assert json.loads(line)["rule"] == "reward_flat_from_start"
    monitor.tracker = None  # what a caller switching tracking off assigns
    assert isinstance(monitor.tracker, NullTracker)


def test_the_weight_strategies_are_weight_syncs(tmp_path: Path) -> None:
    from mtrl_runtime.training import PushedWeights, SharedWeights, WeightSync

    pushed = PushedWeights(engine=None, update=None, run_dir=tmp_path)  # type: ignore[arg-type]
    try:
        assert isinstance(pushed, WeightSync) and pushed.folder == tmp_path / "adapters"
    finally:
        pushed.close()
    assert all(callable(getattr(SharedWeights, name)) for name in ("apply", "publish", "close"))


def test_the_loop_names_its_collaborators_by_protocol_and_tracks_nothing_by_default() -> None:
    from mtrl_runtime.evaluation import StrictScorer
    from mtrl_runtime.training import TrainingLoop, WeightSync
    from mtrl_runtime.training import _loop

    hints = typing.get_type_hints(TrainingLoop, vars(_loop))
    assert hints["weights"] is WeightSync and hints["tracker"] is RunTracker
    assert hints["monitor"] == StepObserver | None and hints["strict_scorer"] == StrictScorer | None
    loop = TrainingLoop(config=MtrlConfig(), schedule=None, dispatcher=None, weights=None,  # type: ignore[arg-type]
                        checkpoints=None)  # type: ignore[arg-type]
    assert isinstance(loop.tracker, NullTracker)
