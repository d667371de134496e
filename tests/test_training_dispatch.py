"""The dispatcher against a real coordinator on loopback: groups, failures, timeouts, the data order."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

import openai
import pytest

from mtrl_adapters import aupdate_reward, current_rollout, rollout
from mtrl_runtime.config import GroupPolicyConfig, MtrlConfig
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.executors import InProcessExecutor
from mtrl_runtime.rollouts import GROUP_POLICIES, Dispatcher, GroupRound, TaskSchedule, load_tasks
from mtrl_runtime.types import RolloutStatus, Task


def test_schedule_is_seeded_epoch_wise_and_a_pure_function_of_the_step():
    tasks = load_tasks([{"id": f"t{i}", "prompt": str(i)} for i in range(5)])
    schedule = TaskSchedule.of(tasks, batch_size=2, seed=7)
    first_epoch = [t.id for step in range(2) for t in schedule.batch(step)] + [schedule.batch(2)[0].id]
    assert sorted(first_epoch) == [f"t{i}" for i in range(5)]  # every task once per epoch
    assert [t.id for t in schedule.batch(3)] == [t.id for t in TaskSchedule.of(tasks, 2, seed=7).batch(3)]
    assert [t.id for t in schedule.batch(0)] != [t.id for t in TaskSchedule.of(tasks, 2, seed=8).batch(0)] or \
        [t.id for t in schedule.batch(1)] != [t.id for t in TaskSchedule.of(tasks, 2, seed=8).batch(1)]
    assert schedule.position(3) == {"prompts_drawn": 6, "epoch": 1, "offset": 1}


def test_load_tasks_errors_name_the_row_and_the_field(tmp_path):
    with pytest.raises(ValueError, match="row 1: needs a 'prompt' or 'messages'"):
        load_tasks([{"prompt": "a"}, {"id": "x"}])
    with pytest.raises(ValueError, match="task id 'a' appears more than once"):
        load_tasks([{"id": "a", "prompt": "1"}, {"id": "a", "prompt": "2"}])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt": "1"}\nnot json\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        load_tasks(bad)


@pytest.mark.parametrize(
    ("policy", "completed", "failed", "retries_used", "action"),
    [
        ("drop_group", 4, 0, 0, "keep"),
        ("drop_group", 3, 1, 0, "drop"),
        ("keep_survivors", 2, 2, 0, "keep"),
        ("keep_survivors", 1, 3, 0, "drop"),
        ("retry", 2, 2, 0, "retry"),
        ("retry", 3, 1, 1, "keep"),  # retries used up: keep the survivors
        ("retry", 1, 3, 1, "drop"),
    ],
)
def test_group_policies(policy, completed, failed, retries_used, action):
    decision = GROUP_POLICIES.get(policy)(GroupRound(4, completed, failed, retries_used), GroupPolicyConfig(min_survivors=2))
    assert decision.action == action
    assert decision.retry == (failed if action == "retry" else 0)


def _agent(fail_first: dict[str, int]):
    """An agent that makes one model call, then fails its group's first ``fail_first[task]`` attempts."""
    attempts: Counter[str] = Counter()
    client = openai.AsyncOpenAI(base_url="http://unused.invalid/v1", api_key="unused", max_retries=0)

    @rollout
    async def agent(task: Task) -> None:
        ctx = current_rollout()
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": task.prompt}])
        attempts[ctx.group_id] += 1
        if task.data.get("sleep"):
            await asyncio.sleep(task.data["sleep"])
        if attempts[ctx.group_id] <= fail_first.get(task.id, 0):
            raise RuntimeError(f"tool backend down for {task.id}")
        await aupdate_reward(1.0 if attempts[ctx.group_id] % 2 else 0.0)

    return agent


def _collect(handle, config: MtrlConfig, tasks: list[Task], fail_first: dict[str, int]):
    dispatcher = Dispatcher(handle.coordinator, InProcessExecutor(_agent(fail_first)), config, handle.url, handle.loop)
    return asyncio.run(dispatcher.collect(0, tasks))


TASKS = [Task(id="clean", prompt="a"), Task(id="one-fails", prompt="b"), Task(id="three-fail", prompt="c")]
FAILS = {"one-fails": 1, "three-fail": 3}


@pytest.mark.parametrize(
    ("on_failure", "kept_sizes", "dropped", "retries", "permanent"),
    [
        ("drop_group", [4, 0, 0], 2, 0, 4),
        ("keep_survivors", [4, 3, 0], 1, 0, 4),  # min_survivors 2
        ("retry", [4, 4, 4], 0, 4, 0),  # one round: 1 + 3 retries, all succeed
    ],
)
def test_group_policy_decides_what_failed_rollouts_do_to_their_group(
    served, tiny_tok, caplog, on_failure, kept_sizes, dropped, retries, permanent
):
    config = MtrlConfig.from_dict({
        "core": {"group_size": 4},
        "advanced": {"group_policy": {"on_failure": on_failure, "min_survivors": 2, "max_retries": 1}},
    })
    handle = served(ScriptedEngine(tiny_tok, lambda req, text: "DONE"), config)
    with caplog.at_level(logging.WARNING, logger="mtrl.train"):
        batch = _collect(handle, config, TASKS, FAILS)

    assert [len(g.kept) for g in batch.groups] == kept_sizes
    assert all(r.status is RolloutStatus.COMPLETED and r.turns for g in batch.groups for r in g.kept)
    metrics = batch.failure_metrics()
    assert metrics["failures/groups_dropped"] == dropped
    assert metrics["failures/retries"] == retries
    assert metrics["failures/rollouts_failed"] == 4  # failed rollouts are recorded whatever the policy
    assert metrics["failures/permanent"] == permanent
    failed = [r for r in batch.rollouts if r.status is RolloutStatus.FAILED]
    assert all("tool backend down" in r.error for r in failed)  # the agent's error, stored
    stored = handle.store.rollouts(step=0, with_turns=False)
    assert len(stored) == 12 + retries and all(r.status.is_final for r in stored)
    assert {r.group_id for r in stored} == {"s0-g0", "s0-g1", "s0-g2"}
    if permanent:  # 4 of 12 rollouts failed for good: far above 1%
        assert metrics["failures/environment_problem"] == 1.0
        assert batch.warnings and "environment problem at step 0" in batch.warnings[0]
        assert "tool backend down" in caplog.text
    else:
        assert metrics["failures/environment_problem"] == 0.0 and not batch.warnings


def test_a_rollout_past_its_timeout_is_finished_timed_out(served, tiny_tok):
    config = MtrlConfig.from_dict({
        "core": {"group_size": 2},
        "advanced": {"rollout_timeout_s": 0.5, "group_policy": {"on_failure": "keep_survivors", "min_survivors": 1}},
    })
    handle = served(ScriptedEngine(tiny_tok, lambda req, text: "DONE"), config)
    batch = _collect(handle, config, [Task(id="slow", prompt="s", data={"sleep": 5.0})], {})
    (group,) = batch.groups
    assert group.dropped and [r.status for r in group.finished] == [RolloutStatus.TIMED_OUT] * 2
    assert all("timeout_s=0.5" in r.error for r in group.finished)
    assert batch.failure_metrics()["failures/rollouts_timed_out"] == 2
    assert batch.seconds < 4  # the agents were stopped, not waited for
    assert handle.coordinator.live_rollout_ids() == []


def test_concurrency_is_limited_across_the_batch(served, tiny_tok):
    config = MtrlConfig.from_dict({"core": {"group_size": 4}, "advanced": {"max_concurrency": 3}})
    handle = served(ScriptedEngine(tiny_tok, lambda req, text: "DONE"), config)
    running, peak = 0, 0

    @rollout
    async def agent(task: Task) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        await aupdate_reward(0.0)

    dispatcher = Dispatcher(handle.coordinator, InProcessExecutor(agent), config, handle.url, handle.loop)
    batch = asyncio.run(dispatcher.collect(5, [Task(id="a", prompt="a"), Task(id="b", prompt="b")]))
    assert peak == 3
    assert len(batch.rollouts) == 8 and all(r.step == 5 for r in batch.rollouts)


def test_sync_undecorated_agents_run_in_threads_inside_their_rollout(served, tiny_tok):
    from mtrl_adapters import update_reward

    config = MtrlConfig.from_dict({"core": {"group_size": 12}, "advanced": {"max_concurrency": 24}})
    handle = served(ScriptedEngine(tiny_tok, lambda req, text: "DONE"), config)
    client = openai.OpenAI(base_url="http://unused.invalid/v1", api_key="unused", max_retries=0)

    def agent(task: Task) -> None:  # plain sync code, not decorated: the executor decorates it
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": task.prompt}])
        time.sleep(0.4)  # a blocking tool
        update_reward(float(current_rollout().rollout_id[-1] in "0123456789"))

    executor = InProcessExecutor(agent, max_threads=24)
    dispatcher = Dispatcher(handle.coordinator, executor, config, handle.url, handle.loop)
    batch = asyncio.run(dispatcher.collect(0, [Task(id="a", prompt="a"), Task(id="b", prompt="b")]))
    asyncio.run(executor.close())
    assert len(batch.rollouts) == 24
    assert all(r.status is RolloutStatus.COMPLETED and len(r.turns) == 1 and not r.reward_defaulted for r in batch.rollouts)
    assert batch.seconds < 0.4 * 24 / 6  # more than asyncio's default 6 threads ran at once


def test_every_rollout_samples_with_its_own_seed_and_every_turn_with_its_own(served, tiny_tok):
    """Seeds come from the run's seed, the group and each rollout's serial in it; a retry draws anew,
    turn 1 does not reuse turn 0's noise, and ``sampling_params.seed`` (when set) replaces the run's seed."""
    from mtrl_runtime.seeds import rollout_seed, turn_seed

    seen: list[tuple[str | None, int, int | None]] = []

    def reply(req, text):
        seen.append((req.rollout_id, req.turn_index, req.sampling.seed))
        return "DONE"

    client = openai.AsyncOpenAI(base_url="http://unused.invalid/v1", api_key="unused", max_retries=0)
    failed_once: set[str] = set()

    @rollout
    async def agent(task: Task) -> None:
        messages = [{"role": "user", "content": task.prompt}]
        first = await client.chat.completions.create(model="m", messages=messages)
        messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "again"}]
        await client.chat.completions.create(model="m", messages=messages)
        if task.id == "flaky" and current_rollout().group_id not in failed_once:
            failed_once.add(current_rollout().group_id)
            raise RuntimeError("first attempt fails")
        await aupdate_reward(0.0)

    def seeds_of(core: dict) -> tuple[dict[str, list[int | None]], dict[str, str]]:
        seen.clear()
        failed_once.clear()
        config = MtrlConfig.from_dict({
            "core": {"group_size": 3, **core},
            "advanced": {"group_policy": {"on_failure": "retry", "max_retries": 1}},
        })
        handle = served(ScriptedEngine(tiny_tok, reply), config)
        dispatcher = Dispatcher(handle.coordinator, InProcessExecutor(agent), config, handle.url, handle.loop)
        batch = asyncio.run(dispatcher.collect(0, [Task(id="steady", prompt="a"), Task(id="flaky", prompt="b")]))
        assert [len(g.kept) for g in batch.groups] == [3, 3] and batch.groups[1].retries == 1
        by_rollout: dict[str, list[int | None]] = {}
        for rollout_id, turn, seed in sorted(seen, key=lambda s: (s[0], s[1])):
            by_rollout.setdefault(rollout_id, []).append(seed)
        groups = {r.id: r.group_id for r in handle.store.rollouts(step=0, with_turns=False)}
        return by_rollout, groups

    by_rollout, groups = seeds_of({"seed": 11})
    assert len(by_rollout) == 7  # 3 + 3, and the flaky group's retry
    for group_id, size in (("s0-g0", 3), ("s0-g1", 4)):
        firsts = sorted(seeds[0] for rid, seeds in by_rollout.items() if groups[rid] == group_id)
        assert firsts == sorted(rollout_seed(11, group_id, n) for n in range(size))  # the retry is serial 3
    for seeds in by_rollout.values():
        assert seeds[1] == turn_seed(seeds[0], 1) != seeds[0]
    again, _ = seeds_of({"seed": 11})
    assert sorted(map(tuple, again.values())) == sorted(map(tuple, by_rollout.values()))  # the same seeds every run
    fixed, groups = seeds_of({"seed": 11, "sampling_params": {"seed": 5}})
    assert sorted(s[0] for rid, s in fixed.items() if groups[rid] == "s0-g0") == \
        sorted(rollout_seed(5, "s0-g0", n) for n in range(3))


def test_a_call_that_names_no_seed_samples_with_its_rollouts_and_never_shares_the_runs(served, tiny_tok):
    """An agent whose client does not send the rollout's sampling (raw HTTP, another host) still gets the
    rollout's seed; a run-wide ``sampling_params.seed`` gives each rollout its own and plain calls that seed."""
    from mtrl_runtime.seeds import derived_seed, turn_seed
    from mtrl_runtime.types import SamplingParams

    seen: list[tuple[str | None, int | None]] = []

    def reply(req, text):
        seen.append((req.rollout_id, req.sampling.seed))
        return "DONE"

    handle = served(ScriptedEngine(tiny_tok, reply), MtrlConfig.from_dict({"core": {"sampling_params": {"seed": 5}}}))
    coordinator = handle.coordinator

    def call(rollout_id, token, seed=None):
        messages = [{"role": "user", "content": "hi"}]
        done = asyncio.run_coroutine_threadsafe(
            coordinator.chat(rollout_id, token, messages, None, SamplingParams(seed=seed)), handle.loop)
        return done.result(timeout=30)

    own = coordinator.create_rollout(Task(id="t", prompt="hi"), "g", seed=123)
    plain = [coordinator.create_rollout(Task(id="t", prompt="hi"), "g") for _ in range(2)]
    call(own.rollout_id, own.token)
    call(own.rollout_id, own.token)
    call(own.rollout_id, own.token, seed=9)  # a seed the call names wins
    for h in plain:
        call(h.rollout_id, h.token)
    call(None, None)
    assert seen == [
        (own.rollout_id, 123), (own.rollout_id, turn_seed(123, 1)), (own.rollout_id, turn_seed(9, 2)),
        (plain[0].rollout_id, derived_seed(5, plain[0].rollout_id)),
        (plain[1].rollout_id, derived_seed(5, plain[1].rollout_id)),
        (None, 5),
    ]
    assert seen[3][1] != seen[4][1]


def test_an_orchestrator_names_a_rollouts_seed_when_it_opens_it_over_http(served, tiny_tok):
    """``POST /v1/rollouts`` takes the rollout's seed: an OpenAI client that names none samples with it, turn
    after turn; a seed out of range is a 400 naming the field and the value, and opens nothing."""
    import httpx

    from mtrl_runtime.seeds import derived_seed, turn_seed

    seen: list[tuple[str | None, int | None]] = []

    def reply(req, text):
        seen.append((req.rollout_id, req.sampling.seed))
        return "DONE"

    handle = served(ScriptedEngine(tiny_tok, reply), MtrlConfig.from_dict({"core": {"sampling_params": {"seed": 5}}}))
    opened = [httpx.post(f"{handle.url}/v1/rollouts", json={"task_id": "t", "prompt": "hi", **extra}).json()
              for extra in ({"seed": 77}, {})]
    for made in opened:
        client = openai.OpenAI(base_url=made["base_url"], api_key=made["token"])
        for _ in range(2):
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    named, unnamed = (made["rollout_id"] for made in opened)
    assert seen == [(named, 77), (named, turn_seed(77, 1)),
                    (unnamed, derived_seed(5, unnamed)), (unnamed, turn_seed(derived_seed(5, unnamed), 1))]

    before = handle.coordinator.live_rollout_ids()
    for bad in (-1, 2**63, "7", 1.5):
        refused = httpx.post(f"{handle.url}/v1/rollouts", json={"task_id": "t", "prompt": "hi", "seed": bad})
        error = refused.json()["error"]
        assert refused.status_code == 400 and error["param"] == "seed", refused.text
        assert repr(bad) in error["message"] or str(bad) in error["message"], error
    assert handle.coordinator.live_rollout_ids() == before
