"""The aircraft inspection Strands agent end to end against the coordinator (scripted policy)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from examples.aircraft_inspection import format_answer, load_instances, solve
from examples.aircraft_inspection.agent import run
from mtrl_adapters import rollout_scope
from mtrl_runtime.engines import ScriptedEngine, ScriptedReply
from mtrl_runtime.types import RolloutSpec, RolloutStatus, SamplingParams, Task

_REQUEST = re.compile(r"Inspect aircraft (N[0-9A-Z]+)")


def _expert(request, prompt: str):
    """Replays the reference solver's episode for the aircraft in the last request."""
    tail = _REQUEST.findall(prompt)[-1]
    episode = solve({"id": tail, "data": {"tail_number": tail}})
    steps = [m for m in episode.messages if m["role"] == "assistant" and m.get("tool_calls")]
    if request.turn_index < len(steps):
        fn = steps[request.turn_index]["tool_calls"][0]["function"]
        return ScriptedReply.tool_call(fn["name"], json.loads(fn["arguments"]))
    return format_answer(episode.answer)


def _task(row: dict) -> Task:
    return Task(id=row["id"], prompt=row["prompt"], ground_truth=row["ground_truth"], split=row["split"], data=row["data"])


def test_aircraft_agent_runs_the_sop_and_reports_full_reward(served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, _expert))
    rows = load_instances("test")[:4]

    async def one(row: dict):
        task = _task(row)
        created = handle.coordinator.create_rollout(task, max_turns=10)
        spec = RolloutSpec(
            rollout_id=created.rollout_id, group_id=created.group_id, task=task, token=created.token,
            endpoint=handle.url, model_name="policy", sampling=SamplingParams(max_tokens=256),
            max_turns=10, timeout_s=60,
        )
        with rollout_scope(spec):
            await run(task)
        return created.rollout_id

    async def all_rows():
        return await asyncio.wait_for(asyncio.gather(*(one(r) for r in rows)), 120)

    ids = asyncio.run(all_rows())
    for rollout_id, row in zip(ids, rows):
        stored = handle.store.get_rollout(rollout_id)
        assert stored.status is RolloutStatus.COMPLETED
        assert stored.reward == pytest.approx(1.0)
        assert stored.metrics["field_acc"] == pytest.approx(1.0)
        assert [c.name for c in stored.tool_calls] == [
            "validate_aircraft", "get_maintenance_record", "inspect_mechanical",
            "inspect_electrical", "check_incidents", "file_report",
        ]
        assert len(stored.turns) == 7
        assert {t.segment for t in stored.turns} == {0}, "the episode should be one extending sequence"
        assert row["data"]["tail_number"] in stored.turns[0].messages[-1]["content"]


def test_an_agent_that_loops_past_max_turns_scores_zero_instead_of_failing(served, tiny_tok):
    looping = ScriptedEngine(tiny_tok, lambda request, prompt: ScriptedReply.tool_call(
        "validate_aircraft", {"tail_number": _REQUEST.findall(prompt)[-1]}))
    handle = served(looping)
    task = _task(load_instances("test")[0])
    created = handle.coordinator.create_rollout(task, max_turns=3)
    spec = RolloutSpec(
        rollout_id=created.rollout_id, group_id=created.group_id, task=task, token=created.token,
        endpoint=handle.url, model_name="policy", sampling=SamplingParams(max_tokens=256),
        max_turns=3, timeout_s=60,
    )

    async def episode():
        with rollout_scope(spec):
            return await run(task)

    assert asyncio.run(asyncio.wait_for(episode(), 60)) == ""
    stored = handle.store.get_rollout(created.rollout_id)
    assert stored.status is RolloutStatus.COMPLETED and stored.reward == 0.0
    assert len(stored.turns) == 3  # the fourth call was refused (409), after a tool had run
