"""The Ray executor on a local 2-CPU Ray cluster, against a coordinator served on loopback.

The agents (``_ray_agents``) run in Ray worker processes and reach the
coordinator over HTTP; the scripted policy of the adapter tests answers, so
every recorded turn and tool call can be checked against its own task.
One agent kills its worker process (``os._exit``) mid-episode: only its
rollout fails, with Ray's reason, and the group policy retries it.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from _adapter_support import CRASH_KEY, check_attribution, policy, specs, tasks
from _groups import processes
from _ray_agents import KILL_KEY, async_agent, slow_agent, sync_agent, worker_pid
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.executors import RayExecutor
from mtrl_runtime.rollouts import Dispatcher
from mtrl_runtime.types import RolloutSpec, RolloutStatus, SamplingParams, Task

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.timeout(600), processes]  # never beside another cluster or torchrun job
TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def ray_cluster(ray_temp_dir: Path) -> Any:
    """One local cluster for the module: 2 CPUs, no auth, no dashboard, its files in a short temp folder."""
    previous = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    python_path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _temp_dir=str(ray_temp_dir),
        runtime_env={"env_vars": {"PYTHONPATH": python_path, "TOKENIZERS_PARALLELISM": "false"}},
        log_to_driver=False,
    )
    try:
        yield
    finally:
        ray.shutdown()
        if previous is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = previous


async def finish_like_the_dispatcher(handle: Any, spec: RolloutSpec, outcome: Any) -> None:
    """End a rollout the agent could not end itself (its worker died), as the dispatcher does."""
    done = asyncio.run_coroutine_threadsafe(handle.coordinator.finish(spec.rollout_id, outcome.status, outcome.error),
                                            handle.loop)
    await asyncio.wrap_future(done)


async def test_rollouts_run_in_ray_workers_and_a_killed_worker_fails_only_its_rollout(ray_cluster, served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, policy))
    runs = specs(handle, tasks(8))  # K00..K07: K05 raises in the agent, K07 kills its worker
    executor = RayExecutor(sync_agent, num_cpus=0.5)
    assert not executor.owns_ray  # the module's cluster is used and left running
    outcomes = await asyncio.gather(*(executor.run(spec) for spec in runs))
    await executor.close()
    assert ray.is_initialized()
    for spec, outcome in zip(runs, outcomes):
        await finish_like_the_dispatcher(handle, spec, outcome)
        if KILL_KEY in spec.task.prompt:
            assert outcome.status is RolloutStatus.FAILED
            assert outcome.error.startswith("the Ray worker running this rollout died: WorkerCrashedError"), outcome.error
            record = handle.store.get_rollout(spec.rollout_id)
            assert record.status is RolloutStatus.FAILED and record.error == outcome.error
            assert len(record.turns) == 1  # the turn it made before dying stays recorded
            continue
        record = check_attribution(handle.store, spec)
        assert outcome.status is record.status
        if CRASH_KEY in spec.task.prompt:
            assert "agent crashed on purpose" in outcome.error
    assert handle.coordinator.live_rollout_ids() == []


async def test_async_actors_serve_many_rollouts_each_and_come_back_after_a_crash(ray_cluster, served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, policy))
    executor = RayExecutor(async_agent, num_cpus=0.5, actors=2, actor_concurrency=8)
    try:
        first = specs(handle, [t for t in tasks(8) if KILL_KEY not in t.prompt])
        outcomes = await asyncio.gather(*(executor.run(spec) for spec in first))
        for spec, outcome in zip(first, outcomes):
            assert check_attribution(handle.store, spec).status is outcome.status

        doomed = specs(handle, [t for t in tasks(8) if KILL_KEY in t.prompt])[0]
        outcome = await executor.run(doomed)
        assert outcome.status is RolloutStatus.FAILED
        assert outcome.error.startswith("the Ray actor running this rollout died: "), outcome.error
        await finish_like_the_dispatcher(handle, doomed, outcome)

        again = specs(handle, tasks(3))  # the restarted actor serves the next rollouts
        outcomes = await asyncio.gather(*(executor.run(spec) for spec in again))
        assert [o.status for o in outcomes] == [RolloutStatus.COMPLETED] * 3, [o.error for o in outcomes]
    finally:
        await executor.close()


async def test_the_group_policy_retries_a_group_whose_worker_died(ray_cluster, served, tiny_tok, tmp_path):
    config = MtrlConfig.from_dict({
        "core": {"group_size": 2, "max_turns": 8, "sampling_params": {"max_tokens": 256}},
        "advanced": {"group_policy": {"on_failure": "retry", "max_retries": 1}, "rollout_timeout_s": 120},
    })
    handle = served(ScriptedEngine(tiny_tok, policy), config)
    marker = tmp_path / "killed-once"
    work = [Task(id="t07", prompt=f"What is the value of key {KILL_KEY} plus 5?", data={"once_marker": str(marker)}),
            Task(id="t00", prompt="What is the value of key K00 plus 5?")]
    executor = RayExecutor(sync_agent, num_cpus=0.5)
    dispatcher = Dispatcher(handle.coordinator, executor, config, handle.url, handle.loop)
    batch = await dispatcher.collect(0, work)
    await executor.close()
    killed, plain = batch.groups
    assert marker.exists()
    assert killed.retries == 1 and len(killed.kept) == 2 and len(killed.finished) == 3
    died = [r for r in killed.finished if r.status is RolloutStatus.FAILED]
    assert len(died) == 1 and "the Ray worker running this rollout died" in died[0].error
    assert plain.retries == 0 and len(plain.kept) == 2
    assert all(r.status is RolloutStatus.COMPLETED for r in killed.kept + plain.kept)


async def test_an_undecorated_function_is_decorated_and_timeouts_are_reported(ray_cluster, served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, policy))
    executor = RayExecutor(worker_pid, num_cpus=0.5)
    spec = specs(handle, tasks(1))[0]
    outcome = await executor.run(spec)
    # the decorated function made no model call and reported nothing: the rollout completed, reward defaulted
    assert outcome.status is RolloutStatus.COMPLETED
    assert handle.store.get_rollout(spec.rollout_id).status is RolloutStatus.COMPLETED
    await executor.close()
    with pytest.raises(RuntimeError, match="the Ray executor is closed"):
        await executor.run(spec)
    with pytest.raises(ValueError, match="Ray is already initialized in this process; drop them"):
        RayExecutor(worker_pid, address="auto")

    slow = RayExecutor(slow_agent, num_cpus=0.5)
    task = Task(id="slow", prompt="What is the value of key K01 plus 5?", data={"sleep_s": 60})
    created = handle.coordinator.create_rollout(task)
    stuck = RolloutSpec(created.rollout_id, created.group_id, task, created.token, handle.url, "policy",
                        SamplingParams(), max_turns=4, timeout_s=1.0)
    outcome = await slow.run(stuck)
    await slow.close()
    assert outcome.status is RolloutStatus.TIMED_OUT
    assert outcome.error == "the Ray task did not finish within timeout_s=1 (+5 s) and was cancelled"


async def test_an_agent_module_the_workers_cannot_import_fails_its_rollouts_with_the_reason(
    ray_cluster, served, tiny_tok, tmp_path, monkeypatch
):
    (tmp_path / "ghost_agent.py").write_text("def agent(task):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # importable here, not on the workers
    import ghost_agent

    handle = served(ScriptedEngine(tiny_tok, policy))
    executor = RayExecutor(ghost_agent.agent, num_cpus=0.5)
    outcome = await executor.run(specs(handle, tasks(1))[0])
    await executor.close()
    assert outcome.status is RolloutStatus.FAILED
    assert outcome.error == ("the Ray worker running this rollout raised RaySystemError: "
                             "System error: No module named 'ghost_agent'")
