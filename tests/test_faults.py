"""Fault injection: broken agents, engines and tools, driven through the real dispatcher.

Every fault of ``tests/_faults.py`` runs as a group of rollouts through
``Dispatcher`` + ``InProcessExecutor`` against a coordinator served on
127.0.0.1 over the scripted engine. For each: the rollout ends with the
expected status and reason, the group policy keeps or drops its group,
every rollout created is in the store with a final status (none lost, none
left live), and healthy rollouts run after the faults (the coordinator keeps
serving). Raw-HTTP faults (NaN rewards, malformed reports, a client that
drops a stream) are checked route by route.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from _faults import EXPECTED, FAULTS, FaultAgent, FaultPolicy, fault_of, fault_task
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.executors import InProcessExecutor
from mtrl_runtime.rollouts import Dispatcher
from mtrl_runtime.types import RolloutStatus, Task

MAX_TURNS = 4
TIMEOUT_S = 8.0


def _config(policy: str = "keep_survivors", **group_policy: Any) -> MtrlConfig:
    return MtrlConfig.from_dict({
        "core": {"group_size": 2, "max_turns": MAX_TURNS},
        "advanced": {
            "rollout_timeout_s": TIMEOUT_S,
            "group_policy": {"on_failure": policy, "min_survivors": 1, **group_policy},
        },
    })


def _serve(served: Any, tiny_tok: Any, config: MtrlConfig) -> Any:
    return served(ScriptedEngine(tiny_tok, FaultPolicy()), config)


async def _collect(handle: Any, config: MtrlConfig, tasks: list[Task], step: int = 0, agent: Any = None) -> Any:
    agent = agent or FaultAgent()
    executor = InProcessExecutor(agent)
    dispatcher = Dispatcher(handle.coordinator, executor, config, handle.url, handle.loop)
    try:
        return await dispatcher.collect(step, tasks)
    finally:
        await executor.close()
        if isinstance(agent, FaultAgent):
            await agent.aclose()


def assert_nothing_lost(handle: Any) -> list[Any]:
    """Every rollout the coordinator created is stored with a final status; a completed one has its record."""
    stored = handle.store.rollouts()
    assert len(stored) == handle.coordinator.counters["rollouts_created"]
    assert handle.coordinator.live_rollout_ids() == []
    assert all(r.status.is_final for r in stored), [(r.id, r.status) for r in stored if not r.status.is_final]
    for rollout in stored:
        if rollout.status is RolloutStatus.COMPLETED:
            assert rollout.turns and rollout.reward is not None, rollout.id
    return stored


async def test_every_fault_ends_as_expected_and_the_coordinator_keeps_serving(served, tiny_tok):
    config = _config()
    handle = _serve(served, tiny_tok, config)
    tasks = [fault_task(name) for name in FAULTS if name != "flaky_agent"] + [fault_task("healthy")]
    started = time.monotonic()
    batch = await _collect(handle, config, tasks)
    assert time.monotonic() - started < TIMEOUT_S + 20  # bounded: the hang cost one timeout, nothing waited forever

    for group in batch.groups:
        fault = fault_of(group.task.id)
        expected = EXPECTED[fault]
        assert len(group.finished) == 2, fault
        for rollout in group.finished:
            assert rollout.status.value == expected.status, (fault, rollout.status, rollout.error)
            if expected.error:
                assert expected.error in (rollout.error or ""), (fault, rollout.error)
        assert group.dropped is not expected.survives, fault
        assert len(group.kept) == (2 if expected.survives else 0), fault

    by_fault = {fault_of(g.task.id): g.finished[0] for g in batch.groups}
    limit = by_fault["exceeds_max_turns"]
    assert len(limit.turns) == MAX_TURNS and limit.metrics.get("hit_turn_limit") == 1.0
    assert by_fault["malformed_tool_call"].turns[0].malformed_tool_call
    assert handle.coordinator.counters["malformed_tool_calls"] >= 2
    assert by_fault["reward_twice"].reward == 1.0 and not by_fault["reward_twice"].reward_defaulted
    silent = by_fault["never_reports"]
    assert silent.reward_defaulted and silent.reward == 0.0 and silent.metrics.get("reward_defaulted") == 1.0
    assert [t.index for t in by_fault["engine_fails_once"].turns] == [0, 1]  # the retried turn is recorded once
    assert [len(by_fault[f].turns) for f in ("engine_fails", "stream_engine_fails")] == [1, 1]
    assert by_fault["nan_reward"].reward_defaulted  # the NaN never reached the store
    tool = by_fault["tool_raises"].tool_calls[0]
    assert tool.status == "error" and "lookup failed for K1" in tool.error and tool.turn_index == 0
    assert len(by_fault["agent_hangs"].turns) == 1
    assert handle.coordinator.counters["engine_failures"] >= 2 * 3 + 2  # permanent: 3 attempts each; transient: 1
    assert_nothing_lost(handle)

    after = await _collect(handle, config, [fault_task("healthy", i) for i in range(4)], step=1)
    assert all(len(g.kept) == 2 for g in after.groups)
    assert httpx.get(f"{handle.url}/health").json()["status"] == "ok"
    assert_nothing_lost(handle)


@pytest.mark.parametrize(
    "policy, kept, dropped, retries",
    [("drop_group", 0, True, 0), ("keep_survivors", 1, False, 0), ("retry", 2, False, 1)],
)
async def test_the_group_policy_decides_a_group_with_one_failed_rollout(served, tiny_tok, policy, kept, dropped, retries):
    config = _config(policy, max_retries=1)
    handle = _serve(served, tiny_tok, config)
    batch = await _collect(handle, config, [fault_task("flaky_agent")])
    group = batch.groups[0]
    assert (len(group.kept), group.dropped, group.retries) == (kept, dropped, retries)
    failed = [r for r in group.finished if r.status is RolloutStatus.FAILED]
    assert len(failed) == 1 and "agent crashed on purpose" in failed[0].error
    assert batch.failure_metrics()["failures/retries"] == retries
    assert_nothing_lost(handle)


async def test_a_sync_agent_past_its_timeout_is_timed_out_and_its_late_reports_refused(served, tiny_tok):
    config = MtrlConfig.from_dict({"core": {"group_size": 1}, "advanced": {"rollout_timeout_s": 1.0}})
    handle = _serve(served, tiny_tok, config)
    late: list[BaseException] = []

    def slow_agent(task: Any) -> None:  # a thread cannot be interrupted: it wakes after the rollout was ended
        from mtrl_adapters import update_reward

        time.sleep(2.0)
        try:
            update_reward(1.0)
        except Exception as exc:
            late.append(exc)

    batch = await _collect(handle, config, [fault_task("healthy")], agent=slow_agent)
    rollout = batch.groups[0].finished[0]
    assert rollout.status is RolloutStatus.TIMED_OUT and "timeout_s" in rollout.error
    for _ in range(50):  # the agent's thread outlives the rollout; wait for its refused report
        if late:
            break
        await asyncio.sleep(0.1)
    assert late and getattr(late[0], "status", None) == 409
    stored = handle.store.get_rollout(rollout.id)
    assert stored.reward_defaulted and stored.reward == 0.0 and stored.status is RolloutStatus.TIMED_OUT
    assert_nothing_lost(handle)


def _auth(rollout: Any) -> dict[str, str]:
    return {"authorization": f"Bearer {rollout.token}", "content-type": "application/json"}


@pytest.mark.parametrize(
    "body, needle",
    [
        (b'{"reward": NaN}', "not valid JSON"),
        (b'{"reward": Infinity}', "not valid JSON"),
        (b'{"reward": 1e999}', "number is infinity"),
        (b'{"turn_rewards": [0.5, NaN]}', "not valid JSON"),
        (b'{"reward": 1.0, "metrics": {"acc": -1e400}}', "number is infinity"),
        (b'{"reward": 1.0, "turn_rewards": [1.0]}', "exactly one"),
        (b'{"reward": "high"}', "reward"),
        (b'{"reward": 1.0, "metrics": {"": 1.0}}', "metrics key"),
    ],
)
def test_a_non_finite_or_malformed_reward_over_http_is_refused_and_changes_nothing(served, tiny_tok, body, needle):
    handle = _serve(served, tiny_tok, _config())
    rollout = handle.coordinator.create_rollout(Task(id="t", prompt="q"))
    r = httpx.post(f"{handle.url}/rollouts/{rollout.rollout_id}/reward", content=body, headers=_auth(rollout))
    assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text
    assert handle.store.get_rollout(rollout.rollout_id).reward is None
    ok = httpx.post(f"{handle.url}/rollouts/{rollout.rollout_id}/reward", json={"reward": 0.5}, headers=_auth(rollout))
    assert ok.status_code == 200 and handle.store.get_rollout(rollout.rollout_id).reward == 0.5


def test_a_second_reward_is_kept_while_running_and_refused_after_the_end(served, tiny_tok):
    handle = _serve(served, tiny_tok, _config())
    rollout = handle.coordinator.create_rollout(Task(id="t", prompt="q"))
    base = f"{handle.url}/rollouts/{rollout.rollout_id}"
    for reward in (0.25, 1.0):
        assert httpx.post(f"{base}/reward", json={"reward": reward}, headers=_auth(rollout)).status_code == 200
    assert httpx.post(f"{base}/complete", json={"status": "completed"}, headers=_auth(rollout)).status_code == 200
    same = httpx.post(f"{base}/reward", json={"reward": 1.0}, headers=_auth(rollout))
    other = httpx.post(f"{base}/reward", json={"reward": 0.0}, headers=_auth(rollout))
    assert same.status_code == 200 and other.status_code == 409 and "0.0" in other.json()["error"]["message"]
    assert handle.store.get_rollout(rollout.rollout_id).reward == 1.0


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"arguments": {"key": "K1"}}, "name: field required"),
        ({"name": ""}, "name"),
        ({"name": "lookup", "status": "maybe"}, "status"),
        ({"name": "lookup", "latency_s": -1}, "latency_s"),
        ({"name": "lookup", "turn_index": -2}, "turn_index"),
        ({"name": "lookup", "unknown_field": 1}, "unknown_field"),
        ({"calls": "not a list"}, "calls"),
    ],
)
def test_a_malformed_tool_call_report_is_refused_and_changes_nothing(served, tiny_tok, body, needle):
    handle = _serve(served, tiny_tok, _config())
    rollout = handle.coordinator.create_rollout(Task(id="t", prompt="q"))
    route = "tool_calls/batch" if "calls" in body else "tool_calls"
    r = httpx.post(f"{handle.url}/rollouts/{rollout.rollout_id}/{route}", content=json.dumps(body), headers=_auth(rollout))
    assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text
    assert handle.store.count_tool_calls(rollout.rollout_id) == 0


def test_an_empty_call_id_is_recorded_as_no_call_id(served, tiny_tok):
    handle = _serve(served, tiny_tok, _config())
    rollout = handle.coordinator.create_rollout(Task(id="t", prompt="q"))
    r = httpx.post(f"{handle.url}/rollouts/{rollout.rollout_id}/tool_calls", json={"name": "lookup", "call_id": ""},
                   headers=_auth(rollout))
    assert r.status_code == 200, r.text
    assert handle.store.get_rollout(rollout.rollout_id).tool_calls[0].call_id is None


def test_a_client_that_drops_a_stream_loses_no_turn_and_the_rollout_goes_on(served, tiny_tok):
    handle = _serve(served, tiny_tok, _config())
    rollout = handle.coordinator.create_rollout(fault_task("healthy"))
    url = f"{handle.url}/rollouts/{rollout.rollout_id}/v1/chat/completions"
    body = {"messages": [{"role": "user", "content": rollout.task.prompt}], "stream": True}
    with httpx.Client(timeout=30) as client, client.stream("POST", url, json=body, headers=_auth(rollout)) as response:
        assert response.status_code == 200
        next(response.iter_bytes())  # read one chunk, then hang up
    # the scripted reply was whole before its first byte left (real streaming: the turn's commit may still be in
    # flight); a hang-up after the generation never drops the turn (tests/test_streaming.py: one during it does)
    deadline = time.monotonic() + 10
    while handle.store.count_turns(rollout.rollout_id) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert handle.store.count_turns(rollout.rollout_id) == 1
    follow = {"messages": [{"role": "user", "content": rollout.task.prompt}], "max_tokens": 8}
    assert httpx.post(url, json=follow, headers=_auth(rollout), timeout=30).status_code == 200
    assert handle.store.count_turns(rollout.rollout_id) == 2


def test_an_engine_failure_on_a_stream_is_an_error_response_before_any_chunk(served, tiny_tok):
    handle = _serve(served, tiny_tok, _config())
    rollout = handle.coordinator.create_rollout(fault_task("stream_engine_fails"))
    url = f"{handle.url}/rollouts/{rollout.rollout_id}/v1/chat/completions"
    body = {"messages": [{"role": "user", "content": rollout.task.prompt}], "stream": True}
    assert httpx.post(url, json=body, headers=_auth(rollout), timeout=30).status_code == 200  # turn 0
    failed = httpx.post(url, json=body, headers=_auth(rollout), timeout=30)  # turn 1: the engine fails
    assert failed.status_code == 502 and failed.headers["content-type"] == "application/json"
    assert "the policy engine failed" in failed.json()["error"]["message"]
    assert handle.store.count_turns(rollout.rollout_id) == 1
    assert httpx.get(f"{handle.url}/health").status_code == 200


def test_an_idle_agent_connection_outlives_the_clients_own_keep_alive(served, tiny_tok):
    """httpx and openai drop idle connections after 5 s; the server must not close them first (a send racing
    the server's close is a ReadError for an agent's report)."""
    import http.client

    from mtrl_runtime.server import KEEP_ALIVE_S

    handle = served(ScriptedEngine(tiny_tok, ["ok"]))
    assert handle.server.config.timeout_keep_alive == KEEP_ALIVE_S > 5
    conn = http.client.HTTPConnection(handle.host, handle.port, timeout=10)
    try:
        for pause in (0.0, 5.5):
            time.sleep(pause)
            conn.request("GET", "/health")
            response = conn.getresponse()
            assert response.status == 200 and json.loads(response.read())["status"] == "ok"
    finally:
        conn.close()


async def test_a_sync_agent_returning_an_awaitable_fails_its_rollout_instead_of_ending_empty(served, tiny_tok):
    config = _config()
    handle = _serve(served, tiny_tok, config)

    async def work(task: Any) -> None:
        await asyncio.sleep(0)

    batch = await _collect(handle, config, [fault_task("healthy")], agent=lambda task: work(task))
    for rollout in batch.groups[0].finished:
        assert rollout.status is RolloutStatus.FAILED and "an awaitable nobody awaits" in rollout.error
    assert_nothing_lost(handle)
