"""SageMaker's LangChain/LangGraph adapter, unmodified, against mtrl's compatibility routes.

``sagemaker.train.rft.adapters.langchain.create_http_clients`` gives httpx
clients whose request hook adds the rollout's ``X-Amzn-SageMaker-*``
headers from the rollout context ``sagemaker_rft_handler`` opens; its
docstrings hand them to one ``ChatOpenAI``. The agent
(``tests/_adapter_agents.py sagemaker-langchain``) is a LangGraph
``create_react_agent`` on that one shared model, invoked synchronously
(the adapter's async client cannot send: the last test), served by AgentCore's
``app.run()``, scored on the dataset row's own top-level ``answer`` key, with
SigV4 tokens from dummy credentials. No mtrl code runs in the agent process.

Sixteen rollouts run at once, two per task (siblings share their prompt):
every stored turn must be one its own agent received (the scripted policy
signs each answer with the rollout it was recorded on; tool-call ids are
minted per reply), ``K03``'s tool error reaches the model, and ``K05``'s
agent crash ends its rollout failed with the agent's own error text.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from _adapter_support import CRASH_KEY, ERROR_KEY, OFFSET, agent_process, key_of, policy, run_all, value_of
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine, ScriptedReply
from mtrl_runtime.executors import HttpExecutor
from mtrl_runtime.types import RolloutSpec, RolloutStatus, SamplingParams, Task

pytest.importorskip("sagemaker.train.rft.adapters.langchain")
pytest.importorskip("langchain_openai")
pytest.importorskip("bedrock_agentcore")

DUMMY_AWS = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "dummy-secret", "AWS_REGION": "local"}
KEYS = (0, 1, 2, 3, 4, 5, 6, 7)  # K03: lookup raises; K05: the agent raises
GROUP_SIZE = 2


def _compat() -> MtrlConfig:
    return MtrlConfig.from_dict({"advanced": {"server": {
        "sagemaker_compat": True, "sagemaker_access_key_id": DUMMY_AWS["AWS_ACCESS_KEY_ID"],
        "sagemaker_secret": DUMMY_AWS["AWS_SECRET_ACCESS_KEY"]}}})


def _signed(request: Any, prompt: str) -> ScriptedReply | str:
    reply = policy(request, prompt)
    return f"{reply} [{request.rollout_id}]" if isinstance(reply, str) else reply


def _group_specs(handle: Any) -> list[RolloutSpec]:
    out = []
    for k in KEYS:
        key = f"K{k:02d}"
        task = Task(id=f"t{k:02d}", prompt=f"What is the value of key {key} plus {OFFSET}?",
                    data={"answer": value_of(key) + OFFSET})  # a top-level dataset key the agent reads
        group = None
        for _ in range(GROUP_SIZE):
            created = handle.coordinator.create_rollout(task, group_id=group)
            group = created.group_id
            out.append(RolloutSpec(rollout_id=created.rollout_id, group_id=created.group_id, task=task,
                                   token=created.token, endpoint=handle.url, model_name="policy",
                                   sampling=SamplingParams(max_tokens=256), max_turns=8, timeout_s=120.0))
    return out


def _misdelivered(turn: Any, spec: RolloutSpec, seen: dict[str, Any]) -> bool:
    mine = seen.get(spec.rollout_id, {"tool_use_ids": [], "texts": []})
    ids = [call["id"] for call in turn.tool_calls]
    if ids:
        return not set(ids) <= set(mine["tool_use_ids"])
    return not any(f"[{spec.rollout_id}]" in text for text in mine["texts"])


async def test_sagemaker_langchain_adapter_on_a_shared_chatopenai_trains_against_mtrl(served, tiny_tok, tmp_path):
    handle = served(ScriptedEngine(tiny_tok, _signed), _compat())
    seen_file = tmp_path / "seen.jsonl"
    with agent_process("sagemaker-langchain", handle.url, health="/ping", timeout=120,
                       env={**DUMMY_AWS, "MTRL_TEST_SEEN": str(seen_file)}) as (_, url, _):
        runs = _group_specs(handle)
        outcomes = await run_all(HttpExecutor.for_agentcore(url, coordinator=handle.coordinator), runs)

    seen = {s["rollout_id"]: s for s in map(json.loads, seen_file.read_text().splitlines())}
    counters = handle.coordinator.counters
    for spec, outcome in zip(runs, outcomes):
        record = handle.store.get_rollout(spec.rollout_id)
        key = key_of(spec.task.prompt)
        for turn in record.turns:  # attribution: each turn on its own task's rollout, and received by its own agent
            assert key_of(str(turn.messages[0])) == key
            assert not _misdelivered(turn, spec, seen), (spec.rollout_id, turn.index)
        if key == CRASH_KEY:  # the failure keeps the agent's own error text
            assert outcome.status is RolloutStatus.FAILED and record.status is RolloutStatus.FAILED
            assert "langgraph agent crashed on purpose" in record.error, record.error
            continue
        assert outcome.status is RolloutStatus.COMPLETED, outcome.error
        if key == ERROR_KEY:  # LangGraph's ToolNode returned the tool's error to the model, which gave up
            assert "KeyError" in str(record.turns[1].messages) and (record.reward, len(record.turns)) == (0.0, 2)
            continue
        assert (record.reward, record.reward_defaulted) == (1.0, False)  # scored on instance["answer"]
        assert len(record.turns) == 3
    assert counters["auth_rejected"] == 0 and counters["compat_sigv4_accepted"] > 0
    assert counters["compat_stale_header_refused"] == 0 and counters["compat_reattributed"] == 0


def test_the_adapters_async_client_fails_before_sending_against_any_server():
    """Upstream, not mtrl: ``create_async_http_client`` hooks a plain function into ``httpx.AsyncClient``, which
    awaits its request hooks, so ``ainvoke`` raises TypeError inside httpx before any byte leaves (no server is
    listening here, and the error is not a connection refusal). LangChain agents on SageMaker's adapter must call
    the model synchronously (``invoke``) until the hook is a coroutine function."""
    import asyncio
    import inspect

    from langchain_openai import ChatOpenAI
    from sagemaker.train.rft.adapters import langchain as adapter

    assert not inspect.iscoroutinefunction(adapter._inject_headers)
    llm = ChatOpenAI(model="policy", base_url="http://127.0.0.1:9/v1", api_key="x",
                     http_async_client=adapter.create_async_http_client(), max_retries=0)

    async def call() -> BaseException:
        try:
            await llm.ainvoke("hi")
        except Exception as exc:  # langchain's connection error, caused by httpx awaiting the sync hook
            return exc
        raise AssertionError("the async client sent a request")

    chain, error = [], asyncio.run(call())
    while error is not None:
        chain.append(error)
        error = error.__cause__ or error.__context__
    assert any(isinstance(e, TypeError) and "can't be used in 'await' expression" in str(e) for e in chain), chain
