"""Dynamic sampling: groups without signal refilled from a seeded stream, bounded, counted, resumable.

The tasks (``_refill_task``) are half *flat* (every rollout scores the same:
no signal) and half *live* (rewards never tie), so whether a group is useful
is a property of its task. That gives the expected outcome of every step
independently of the code under test: the step's own groups, then the
shortest prefix of ``TaskSchedule.refill(step, 0, ...)`` that brings the live
groups to ``train_batch_size``, capped at ``max_extra_groups``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

import _refill_task as rt
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.executors import InProcessExecutor
from mtrl_runtime.rollouts import Dispatcher, TaskSchedule, load_tasks
from mtrl_runtime.store import SQLiteStore
from mtrl_runtime.training import sample_step
from mtrl_runtime.training._progress import step_line
from mtrl_runtime.training._resume import RESUMES_KEY
from mtrl_runtime.types import RolloutStatus

TASKS = load_tasks(rt.TASKS)
CHILD = Path(__file__).resolve().parent / "_refill_task.py"
STEPS = 4  # of the seed's schedule: a step with no refill, one refilled to full, one stopped by the bound


def schedule(seed: int = rt.SEED) -> TaskSchedule:
    return TaskSchedule.of(TASKS, rt.BATCH, seed)


def expected_extra(sched: TaskSchedule, step: int, bound: int) -> int:
    """The shortest refill prefix that makes the batch's live groups ``batch_size``, at most ``bound``."""
    live = sum(not t.data["flat"] for t in sched.batch(step))
    n = 0
    for task in sched.refill(step, 0, bound):
        if live >= sched.batch_size:
            break
        live += not task.data["flat"]
        n += 1
    return n


def expected_groups(sched: TaskSchedule, step: int, bound: int) -> dict[str, str]:
    """group id -> task id of a step: its own groups, then the refill's."""
    own = {f"s{step}-g{i}": t.id for i, t in enumerate(sched.batch(step))}
    extra = sched.refill(step, 0, expected_extra(sched, step, bound))
    return {**own, **{f"s{step}-r{k}": t.id for k, t in enumerate(extra)}}


def stored_groups(store: SQLiteStore) -> dict[int, dict[str, str]]:
    """Per step, group id -> task id of the completed rollouts in a run's store."""
    out: dict[int, dict[str, str]] = defaultdict(dict)
    for r in store.rollouts(status=RolloutStatus.COMPLETED, with_turns=False):
        assert out[r.step].setdefault(r.group_id, r.task_id) == r.task_id, r.group_id
    return dict(out)


def test_the_refill_stream_is_a_pure_function_of_seed_step_and_index():
    sched = schedule()
    whole = [t.id for t in sched.refill(3, 0, 12)]
    assert whole == [t.id for t in sched.refill(3, 0, 5) + sched.refill(3, 5, 7)]  # drawn in any rounds
    assert whole == [t.id for t in schedule().refill(3, 0, 12)]  # another process, the same stream
    in_batch = {t.id for t in sched.batch(3)}
    assert not in_batch & set(whole[:6]) and sorted(whole[:6]) == sorted({t.id for t in TASKS} - in_batch)
    assert whole[6:12] != whole[:6] and sorted(whole[6:12]) == sorted(whole[:6])  # epoch-wise, reshuffled
    assert [t.id for t in sched.refill(4, 0, 6)] != whole[:6] or [t.id for t in sched.refill(5, 0, 6)] != whole[:6]
    assert [t.id for t in schedule(seed=8).refill(3, 0, 6)] != whole[:6]
    # the main order and the data position do not depend on any refill
    assert sched.position(4) == {"prompts_drawn": 8, "epoch": 1, "offset": 0}
    with pytest.raises(ValueError, match="refill: step, start and count must be >= 0, got 1, -1, 2"):
        sched.refill(1, -1, 2)


def _dispatcher(served, tiny_tok, config: MtrlConfig):
    handle = served(ScriptedEngine(tiny_tok, lambda request, text: "DONE"), config)
    executor = InProcessExecutor(rt.make_agent())
    return handle, Dispatcher(handle.coordinator, executor, config, handle.url, handle.loop)


def test_each_step_is_refilled_to_a_full_batch_of_useful_groups_within_the_bound(served, tiny_tok, tmp_path):
    config = rt.config(tmp_path, tmp_path)
    handle, dispatcher = _dispatcher(served, tiny_tok, config)
    sched, seen = schedule(), set()

    async def steps() -> list:
        return [await sample_step(dispatcher, sched, step, config) for step in range(STEPS)]

    for step, sampled in enumerate(asyncio.run(steps())):
        batch, m = sampled.batch, sampled.metrics
        groups = {g.id: g.task.id for g in batch.groups}
        assert groups == expected_groups(sched, step, rt.BOUND)  # the same tasks, ids and order as the stream
        assert list(groups)[:rt.BATCH] == [f"s{step}-g{i}" for i in range(rt.BATCH)]
        extra = len(groups) - rt.BATCH
        live = sum(not g.task.data["flat"] for g in batch.groups)
        assert live == rt.BATCH or extra == rt.BOUND  # full, or the bound stopped it
        assert m["analysis/refilled_groups"] == extra <= rt.BOUND
        assert m["analysis/useful_groups"] == live
        assert m["analysis/useful_groups_short"] == rt.BATCH - min(live, rt.BATCH)
        assert m["analysis/refill_groups_dropped"] == sum(g.task.data["flat"] for g in batch.groups[rt.BATCH:])
        assert (m["analysis/refill_rounds"] > 0) == (extra > 0) and m["analysis/refill_rounds"] <= extra
        assert m["analysis/rollouts_spent"] == len(batch.rollouts) == rt.GROUP * len(groups)
        assert m["analysis/rollouts_per_useful_group"] == len(batch.rollouts) / live
        assert all(r.step == step and len(r.turns) == 1 for r in batch.rollouts)
        seen.add("full" if live == rt.BATCH and extra else "short" if extra else "own")
    assert seen == {"own", "full", "short"}  # the seed gives every case
    stored = stored_groups(handle.store)
    assert [len(stored[s]) for s in range(STEPS)] == [len(expected_groups(sched, s, rt.BOUND)) for s in range(STEPS)]

    # collected again with the stored rollouts to reuse (what a resume does): nothing runs, the same groups return
    step = next(s for s in range(STEPS) if expected_extra(sched, s, rt.BOUND))
    reuse: dict[str, list] = defaultdict(list)
    for r in handle.store.rollouts(step=step, status=RolloutStatus.COMPLETED):
        reuse[r.group_id].append(r)
    dispatcher = Dispatcher(handle.coordinator, InProcessExecutor(rt.make_agent()), config, handle.url, handle.loop)
    again = asyncio.run(sample_step(dispatcher, sched, step, config, reuse))
    assert {g.id: g.task.id for g in again.batch.groups} == stored[step]
    assert all(g.reused == rt.GROUP for g in again.batch.groups)
    assert len(handle.store.rollouts(step=step, with_turns=False)) == rt.GROUP * len(stored[step])


def test_off_by_default_the_step_keeps_its_own_groups_and_ids(served, tiny_tok, tmp_path):
    assert MtrlConfig().advanced.dynamic_sampling.enabled is False
    config = rt.config(tmp_path, tmp_path, enabled=False)
    _, dispatcher = _dispatcher(served, tiny_tok, config)
    sched = schedule()
    step = next(s for s in range(8) if expected_extra(sched, s, rt.BOUND))  # a step refill would have refilled
    sampled = asyncio.run(sample_step(dispatcher, sched, step, config))
    assert [(g.id, g.task.id) for g in sampled.batch.groups] == [
        (f"s{step}-g{i}", t.id) for i, t in enumerate(sched.batch(step))]
    live = sum(not t.data["flat"] for t in sched.batch(step))
    assert live < rt.BATCH and sampled.metrics["analysis/useful_groups"] == live
    assert sampled.metrics["analysis/refilled_groups"] == 0 and sampled.metrics["analysis/refill_rounds"] == 0


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_model_dir):
    """An uninterrupted async run (rollouts of step t + 1 collected while step t trains), tracked in MLflow."""
    run = tmp_path_factory.mktemp("reference") / "run"
    result = rt.train(run, tiny_model_dir, tracking=True, mlflow={"log_traces": False},
                      async_config={"enabled": True, "max_steps_off_policy": 1}, max_concurrency=8)
    store = SQLiteStore(run / "trajectories.db")
    yield result, store
    store.close()


@pytest.mark.timeout(120)
def test_an_async_training_run_trains_full_batches_within_the_bound_and_logs_the_counts(reference):
    from mlflow import MlflowClient

    result, store = reference
    sched = schedule()
    stored = stored_groups(store)
    assert [r.step for r in result.reports] == list(range(rt.MAX_STEPS))
    for report in result.reports:
        step, m = report.step, report.metrics
        assert stored[step] == expected_groups(sched, step, rt.BOUND)
        useful = sum(not TASKS_BY_ID[t].data["flat"] for t in stored[step].values())
        assert m["analysis/useful_groups"] == useful and m["analysis/refilled_groups"] == len(stored[step]) - rt.BATCH
        # every rollout of a useful group is trained at its own step, no other rollout is
        trained = [r for r in store.rollouts(step=step, with_turns=False) if store.trained_step(r.id) == step]
        assert len(trained) == rt.GROUP * useful and all(not TASKS_BY_ID[r.task_id].data["flat"] for r in trained)
        assert m["async/stale_samples_dropped"] == 0 and m["async/staleness_max"] <= 1
        assert ("refilled" in step_line(report)) == (m["analysis/refilled_groups"] > 0)
    assert {m["analysis/refilled_groups"] for m in (r.metrics for r in result.reports)} == {0, 2, rt.BOUND}
    assert max(r.metrics["async/staleness_max"] for r in result.reports) == 1  # steps overlapped
    client = MlflowClient(tracking_uri=result.tracking_uri)
    logged = {m.step: m.value for m in client.get_metric_history(result.mlflow_run_id, "analysis/refilled_groups")}
    assert logged == {r.step: r.metrics["analysis/refilled_groups"] for r in result.reports}
    assert client.get_metric_history(result.mlflow_run_id, "analysis/rollouts_per_useful_group")


TASKS_BY_ID = {t.id: t for t in TASKS}


@pytest.mark.timeout(240)
def test_a_sigkill_mid_refill_resumes_with_the_same_tasks_in_the_same_order(reference, tiny_model_dir, tmp_path):
    """Killed (sync, one rollout at a time) while step 1's first extra group runs; resumed in this process."""
    _, ref_store = reference
    kill_step = 1
    assert expected_extra(schedule(), kill_step, rt.BOUND) >= 1  # step 1 does refill
    kill_group = f"s{kill_step}-r0"
    run = tmp_path / "run"
    crashed = subprocess.run([sys.executable, str(CHILD), str(run), str(tiny_model_dir), kill_group],
                             capture_output=True, text=True, timeout=180,
                             env={**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"})
    assert crashed.returncode == -9, crashed.stdout[-2000:] + crashed.stderr[-3000:]
    with SQLiteStore(run / "trajectories.db") as killed:
        before = [r for r in killed.rollouts(step=kill_step, with_turns=False)]
        done_before = {r.id for r in before if r.status is RolloutStatus.COMPLETED}
        first = [r for r in before if r.group_id == kill_group]
        assert [r.status for r in first] == [RolloutStatus.COMPLETED, RolloutStatus.RUNNING]  # killed mid-group
        assert killed.get_meta("checkpoint")["next_step"] == kill_step

    rt.train(run, tiny_model_dir, resume=True, **rt.KILLED_RUN)

    with SQLiteStore(run / "trajectories.db") as store:
        (record,) = store.get_meta(RESUMES_KEY)
        assert record["start_step"] == kill_step
        assert set(record["reused"]) == done_before and not record["discarded"]
        assert record["interrupted"] == [first[1].id]
        # the same tasks under the same group ids, in every step, as the uninterrupted async run drew
        assert stored_groups(store) == stored_groups(ref_store)
        per_group = defaultdict(list)
        for r in store.rollouts(step=kill_step, status=RolloutStatus.COMPLETED, with_turns=False):
            per_group[r.group_id].append(r.id)
        assert first[0].id in per_group[kill_group] and all(len(ids) == rt.GROUP for ids in per_group.values())
        assert [s for s, _, _ in store.metric_history("time/step")] == list(range(rt.MAX_STEPS))
        refilled = {s: v for s, _, v in store.metric_history("analysis/refilled_groups")}
        assert refilled == {s: v for s, _, v in ref_store.metric_history("analysis/refilled_groups")}


def test_the_zero_advantage_diagnosis_suggests_refill_only_where_it_is_off(tmp_path):
    from mtrl_runtime.diagnostics import ZERO_ADV, diagnose, knobs_from_config

    history = [{"step": s, ZERO_ADV: 0.9, "rollout/reward/mean": 0.5} for s in range(5)]
    fixes = {}
    for enabled in (False, True):
        found = diagnose(history, knobs_from_config(rt.config(tmp_path, tmp_path, enabled=enabled)))
        (finding,) = [d for d in found if d.rule == "zero_advantage_groups"]
        fixes[enabled] = finding.first_fix
    assert "advanced.dynamic_sampling.enabled: true" in fixes[False]
    assert "dynamic_sampling" not in fixes[True]
