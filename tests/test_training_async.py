"""The asynchronous loop's staleness bound, the sample filter's drop count, and checkpoint commits."""

from __future__ import annotations

import time

import pytest
import torch

import _lookup_task as lookup
from mtrl_runtime.algorithms import AdvantageParams
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.store import SQLiteStore, hash_token
from mtrl_runtime.testing import tiny_model
from mtrl_runtime.rollouts import GroupResult
from mtrl_runtime.training import (
    Checkpoints,
    MultiTurnRLTrainer,
    PolicyUpdate,
    build_policy,
    prepare_batch,
)
from mtrl_runtime.types import Rollout, RolloutStatus, Task

BOUND = 1


@pytest.fixture(scope="module")
def async_run(tmp_path_factory):
    torch.set_num_threads(1)
    run = tmp_path_factory.mktemp("async") / "run"
    cfg = lookup.config(run, max_steps=6, advanced={"async_config": {"enabled": True, "max_steps_off_policy": BOUND}})
    result = MultiTurnRLTrainer(
        agent_env=lookup.agent, training_dataset=lookup.tasks(), config=MtrlConfig.from_dict(cfg),
        engine=lookup.build_engine(seed=1), tracking=False,
    ).train(progress=False)
    store = SQLiteStore(run / "trajectories.db")
    yield result, store
    store.close()


def test_every_trained_token_is_within_the_staleness_bound(async_run):
    result, store = async_run
    version_at = {r.step: int(r.metrics["async/policy_version"]) for r in result.reports}
    assert len(version_at) == 6 and version_at[5] >= 3  # the policy moved during the run
    gaps = []
    for rollout in store.rollouts():
        step = store.trained_step(rollout.id)
        if step is None:
            continue
        assert step == rollout.step
        gaps += [version_at[step] - turn.policy_version for turn in rollout.turns]
    assert gaps and all(0 <= gap <= BOUND for gap in gaps)
    assert BOUND in gaps  # rollouts of step k+1 really ran while step k trained
    assert max(r.metrics["async/staleness_max"] for r in result.reports) == BOUND
    assert all(r.metrics["async/stale_samples_dropped"] == 0 for r in result.reports)  # the schedule kept the bound


def test_samples_beyond_the_bound_are_dropped_and_counted(async_run):
    result, store = async_run
    report = max(result.reports, key=lambda r: r.metrics["samples/count"])  # a step whose groups carried signal
    step, version = report.step, int(report.metrics["async/policy_version"])
    groups = {}
    for r in store.rollouts(step=step, status=RolloutStatus.COMPLETED):
        groups.setdefault(r.group_id, []).append(r)
    results = [GroupResult(gid, Task(id=gid, prompt="-"), tuple(rs), tuple(rs), False) for gid, rs in groups.items()]
    params = AdvantageParams()
    fresh = prepare_batch(results, "group_based_per_turn", params, version, BOUND)
    later = prepare_batch(results, "group_based_per_turn", params, version + BOUND, BOUND)  # the policy moved on
    built = fresh.metrics["samples/count"] + fresh.metrics["async/stale_samples_dropped"]
    assert built > 0
    newly_stale = sum(1 for d in fresh.staleness_S if d + BOUND > BOUND)  # one more version behind: past the bound
    assert later.metrics["async/stale_samples_dropped"] == fresh.metrics["async/stale_samples_dropped"] + newly_stale
    assert later.metrics["samples/count"] + later.metrics["async/stale_samples_dropped"] == built
    assert all(d <= BOUND for d in later.staleness_S)
    gone = prepare_batch(results, "group_based_per_turn", params, version + BOUND + 1, BOUND)
    assert gone.samples == [] and gone.rollout_ids == [] and gone.metrics["async/stale_samples_dropped"] == built


def _finished_rollouts(store: SQLiteStore, n: int) -> list[str]:
    store.put_task(Task(id="t", prompt="p"))
    ids = []
    for i in range(n):
        store.create_rollout(Rollout(id=f"r{i}", task_id="t", group_id="g", step=i // 2, created_at=time.time()),
                             hash_token(f"token-{i}"))
        store.finish_rollout(f"r{i}", RolloutStatus.COMPLETED)
        ids.append(f"r{i}")
    return ids


def test_checkpoints_commit_trained_steps_once_and_are_atomic(tmp_path, tiny_tok):
    store = SQLiteStore(tmp_path / "trajectories.db")
    ids = _finished_rollouts(store, 4)
    update = PolicyUpdate(build_policy(tiny_model(tiny_tok), tiny_tok, rank=4, alpha=8))
    checkpoints = Checkpoints(tmp_path, store, keep=2)
    checkpoints.record(0, ids[:2], {"time/step": 1.0, "rollout/reward/mean": 0.5})
    checkpoints.record(1, ids[2:], {"time/step": 2.0, "rollout/reward/mean": 0.7})
    assert all(store.trained_step(i) is None for i in ids)  # nothing is trained before its checkpoint exists
    folder = checkpoints.save(2, update, {"prompts_drawn": 4})
    assert folder.name == "step-000002" and (folder / "policy" / "weights").is_dir()
    assert [store.trained_step(i) for i in ids] == [0, 0, 1, 1]
    history = store.metric_history()
    assert sorted(history) == sorted([(0, "time/step", 1.0), (0, "rollout/reward/mean", 0.5),
                                      (1, "time/step", 2.0), (1, "rollout/reward/mean", 0.7)])

    # a crash after the rename, during the commit: committing again on resume changes nothing
    (tmp_path / "checkpoints" / ".step-000004.tmp-crashed").mkdir()  # a half-written checkpoint
    state = checkpoints.restore(update)
    assert state.next_step == 2 and state.data_position == {"prompts_drawn": 4}
    assert store.metric_history() == history and [store.trained_step(i) for i in ids] == [0, 0, 1, 1]

    for step in (4, 6):
        checkpoints.save(step, update, {"prompts_drawn": 2 * step})
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*")) == ["step-000004", "step-000006"]
    assert checkpoints.latest().name == "step-000006"
    store.close()


def test_an_engine_in_another_process_gets_each_version_as_an_adapter_folder(tmp_path, tiny_model_dir, tiny_tok):
    import itertools

    import openai

    from mtrl_adapters import aupdate_reward, rollout
    from mtrl_runtime.engines import ScriptedEngine

    engine = ScriptedEngine(tiny_tok, lambda request, text: "The answer is 42.")  # no .model: weights are pushed
    client = openai.AsyncOpenAI(base_url="http://unused.invalid/v1", api_key="unused", max_retries=0)
    rewards = itertools.cycle([0.0, 1.0, 1.0])

    @rollout
    async def agent(task: Task) -> None:
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": task.prompt}])
        await aupdate_reward(next(rewards))

    cfg = MtrlConfig.from_dict({
        "core": {"run_dir": str(tmp_path / "run"), "model": str(tiny_model_dir), "group_size": 3,
                 "train_batch_size": 2, "max_steps": 3, "lora_rank": 4, "lora_alpha": 8,
                 "sampling_params": {"max_tokens": 16}},
        "advanced": {"checkpoint_every": 0},
    })
    result = MultiTurnRLTrainer(agent_env=agent, training_dataset=[{"id": "a", "prompt": "q"}, {"id": "b", "prompt": "r"}],
                                config=cfg, engine=engine, tracking=False).train(progress=False)
    folder = tmp_path / "run" / "adapters"
    assert engine.adapters == [(str(folder / f"v{v}"), v) for v in (1, 2, 3)]
    assert sorted(p.name for p in folder.iterdir()) == ["v2", "v3"]  # older versions are removed
    assert (folder / "v3" / "adapter_config.json").is_file()
    store = SQLiteStore(tmp_path / "run" / "trajectories.db")
    versions = {r.step: {t.policy_version for t in r.turns} for r in store.rollouts()}
    store.close()
    assert versions == {0: {0}, 1: {1}, 2: {2}}  # each step's turns came from the version pushed before it
    assert result.final_step == 3
