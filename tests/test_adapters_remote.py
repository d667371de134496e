"""Remote agents: the rollout-server contract with the agent in a separate process, and AgentCore.

The coordinator drives the agents with ``HttpExecutor`` over loopback; the
agents report tool calls, rewards and their end over HTTP with each
rollout's own token.
"""

from __future__ import annotations

import httpx
import pytest

from _adapter_support import agent_process, check_attribution, policy, run_all, specs, tasks
from mtrl_adapters import rollout, start_agent_server
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.executors import HttpExecutor
from mtrl_runtime.types import RolloutStatus


@pytest.fixture
def agent_server():
    with agent_process("serve", health="/health") as (_, url, line):
        yield url, line["light"] == "True"


async def test_agent_server_in_another_process_runs_16_rollouts(served, tiny_tok, agent_server):
    url, light = agent_server
    assert light, "the agent process imported torch or the coordinator"
    handle = served(ScriptedEngine(tiny_tok, policy))
    executor = HttpExecutor(url, coordinator=handle.coordinator)
    assert await HttpExecutor(url).health() == {"status": "healthy"}
    runs = specs(handle, tasks(16))
    outcomes = await run_all(executor, runs)
    for spec, outcome in zip(runs, outcomes):
        record = check_attribution(handle.store, spec)
        assert outcome.status is record.status
    assert [o.status for o in outcomes].count(RolloutStatus.FAILED) == 1
    assert handle.coordinator.live_rollout_ids() == []


async def test_agent_server_refuses_bad_rollouts_and_records_nothing(served, tiny_tok, agent_server):
    url, _ = agent_server
    handle = served(ScriptedEngine(tiny_tok, policy))
    good, other = specs(handle, tasks(2))
    executor = HttpExecutor(url, coordinator=handle.coordinator)
    body = executor.request_body(good)

    async with httpx.AsyncClient(timeout=60) as http:
        missing = {**body, "metadata": {k: v for k, v in body["metadata"].items() if k != "rollout_token"}}
        response = await http.post(url + "/rollout", json=missing)
        assert response.status_code == 400 and "metadata.rollout_token: required" in response.text
        response = await http.post(url + "/rollout", json={"metadata": body["metadata"]})
        assert response.status_code == 400 and "instance" in response.text

        forged = {**body, "metadata": {**body["metadata"], "rollout_token": other.token}}
        answer = (await http.post(url + "/rollout", json=forged)).json()
        assert answer["status"] == "failed" and "the token does not belong to this rollout" in answer["error"]

        unknown = {**body, "metadata": {**body["metadata"], "trajectory_id": "r-unknown"}}
        answer = (await http.post(url + "/rollout", json=unknown)).json()
        assert answer["status"] == "failed" and "unknown rollout id 'r-unknown'" in answer["error"]
    record = handle.store.get_rollout(good.rollout_id)
    assert record.turns == () and record.tool_calls == () and record.status is RolloutStatus.RUNNING
    await executor.close()


def test_agent_server_api_key_and_unknown_routes():
    @rollout
    def agent(task):
        return task.prompt

    with start_agent_server(agent, api_key="agent-secret") as server:
        assert httpx.get(server.url + "/health").json() == {"status": "healthy"}
        response = httpx.post(server.url + "/rollout", json={"instance": {}})
        assert response.status_code == 401 and "Authorization" in response.text
        # a refusal closes its connection and says so: a client that reused it found it gone under load
        assert response.headers["connection"] == "close"
        assert httpx.post(server.url + "/other", json={}).status_code == 404
        response = httpx.post(server.url + "/rollout", content=b"{not json", headers={"authorization": "Bearer agent-secret"})
        assert response.status_code == 400 and "not valid JSON" in response.text


async def test_agentcore_app_run_on_loopback_is_trainable(served, tiny_tok):
    with agent_process("agentcore", health="/ping") as (_, url, _):
        handle = served(ScriptedEngine(tiny_tok, policy))
        executor = HttpExecutor.for_agentcore(url, coordinator=handle.coordinator)
        runs = specs(handle, tasks(6))
        outcomes = await run_all(executor, runs)
        for spec, outcome in zip(runs, outcomes):
            assert outcome.status is check_attribution(handle.store, spec).status
        created = handle.coordinator.counters["rollouts_created"]
        plain = httpx.post(url + "/invocations", json={"prompt": "hello"}, timeout=30).json()
        assert plain == {"echo": {"prompt": "hello"}}  # users' invocations are served as before
        assert handle.coordinator.counters["rollouts_created"] == created


async def test_a_streaming_agentcore_entrypoint_is_trainable_and_still_streams_to_users(served, tiny_tok):
    with agent_process("agentcore-stream", health="/ping") as (_, url, _):
        handle = served(ScriptedEngine(tiny_tok, policy))
        executor = HttpExecutor.for_agentcore(url, coordinator=handle.coordinator)
        runs = specs(handle, tasks(4))
        outcomes = await run_all(executor, runs)
        for spec, outcome in zip(runs, outcomes):
            assert outcome.status is check_attribution(handle.store, spec).status
        assert any(o.status is RolloutStatus.COMPLETED for o in outcomes)
        plain = httpx.post(url + "/invocations", json={"prompt": "hello"}, timeout=30)
        assert plain.headers["content-type"].startswith("text/event-stream")  # users' invocations stream as before
        events = [line.removeprefix("data: ") for line in plain.text.split("\n\n") if line]
        assert events == ['{"event": "streamed"}', '{"event": "echo"}', '{"echo": {"prompt": "hello"}}']


async def test_http_executor_sends_the_agent_servers_api_key(served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, policy))

    @rollout
    async def agent(task):
        from mtrl_adapters import aupdate_reward, current_rollout

        assert task.prompt.startswith("What is the value of key K00") and current_rollout().max_turns == 8
        await aupdate_reward(0.5)
        return {"ok": True}

    with start_agent_server(agent, api_key="agent-secret") as server:
        [spec] = specs(handle, tasks(1))
        [refused] = await run_all(HttpExecutor(server.url, coordinator=handle.coordinator), [spec])
        assert refused.status is RolloutStatus.FAILED and "the agent server answered 401" in refused.error, refused.error
        [spec] = specs(handle, tasks(1))
        outcome = await run_all(HttpExecutor(server.url, coordinator=handle.coordinator, api_key="agent-secret"), [spec])
        assert outcome[0].status is RolloutStatus.COMPLETED
        assert handle.store.get_rollout(spec.rollout_id).reward == 0.5
