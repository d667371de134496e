"""The aircraft example's two-role agent (planner + worker) end to end against the coordinator, roles configured.

The scripted engine answers by the role the coordinator asks it for: the planner's call gets a plan, the worker's
calls the reference solver's episode. Each call is recorded as its role's turn, the worker's seven as one
extending sequence of their own, the planner rewarded by its plan and the worker by the episode.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re

import pytest

from examples.aircraft_inspection import format_answer, load_instances, solve
from examples.aircraft_inspection.roles import PLANNER, STEPS, WORKER, plan_score, run, run_one_policy
from mtrl_adapters import rollout_scope
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine, ScriptedReply
from mtrl_runtime.roles import role_view
from mtrl_runtime.types import RolloutSpec, RolloutStatus, SamplingParams, Task

_REQUEST = re.compile(r"Inspect aircraft (N[0-9A-Z]+)")
GOOD_PLAN = "\n".join(f"Step {i}: {step}" for i, step in enumerate(STEPS, 1))
HALF_PLAN = "Step 1: check_incidents\nStep 2: validate_aircraft\nStep 3: inspect_electrical\nStep 4: file_report"


def _by_role(plan: str, roles: bool = True):  # noqa: ANN202
    def reply(request, prompt: str):
        planning = "You plan aircraft inspections" in prompt
        if roles:  # the coordinator asked for the role whose model id the call named
            assert request.role == (PLANNER if planning else WORKER), request.role
        if planning:
            return plan
        tail = _REQUEST.findall(prompt)[-1]
        episode = solve({"id": tail, "data": {"tail_number": tail}})
        steps = [m for m in episode.messages if m["role"] == "assistant" and m.get("tool_calls")]
        index = request.turn_index - 1  # the planner's call was the rollout's first turn
        if index < len(steps):
            fn = steps[index]["tool_calls"][0]["function"]
            return ScriptedReply.tool_call(fn["name"], json.loads(fn["arguments"]))
        return format_answer(episode.answer)
    return reply


def test_plan_score_counts_steps_named_in_order():
    assert plan_score(GOOD_PLAN) == 1.0
    assert plan_score("") == 0.0
    assert plan_score(HALF_PLAN) == pytest.approx(3 / 6)  # validate, electrical, file_report in order


@pytest.mark.parametrize("plan", [GOOD_PLAN, HALF_PLAN], ids=["good-plan", "half-plan"])
def test_two_role_agent_records_each_roles_turns_and_rewards(served, tiny_tok, plan):
    roles = {PLANNER: PLANNER, WORKER: WORKER}
    handle = served(ScriptedEngine(tiny_tok, _by_role(plan)),
                    MtrlConfig.from_dict({"advanced": {"policy_models": roles}}))
    row = load_instances("test")[0]
    task = Task(id=row["id"], prompt=row["prompt"], ground_truth=row["ground_truth"], split=row["split"],
                data=row["data"])
    created = handle.coordinator.create_rollout(task, max_turns=10)
    spec = RolloutSpec(rollout_id=created.rollout_id, group_id=created.group_id, task=task, token=created.token,
                       endpoint=handle.url, model_name="policy", sampling=SamplingParams(max_tokens=256),
                       max_turns=10, timeout_s=60, policy_models=(PLANNER, WORKER))

    async def one() -> None:
        with rollout_scope(spec):
            await run(task)

    asyncio.run(asyncio.wait_for(one(), 120))
    stored = handle.store.get_rollout(created.rollout_id)
    assert stored.status is RolloutStatus.COMPLETED, stored.error
    assert [t.role for t in stored.turns] == [PLANNER] + [WORKER] * 7
    assert stored.reward == pytest.approx(1.0)  # the worker followed the SOP: the episode's reward
    assert stored.role_rewards == {PLANNER: pytest.approx(plan_score(plan))}
    assert stored.metrics["plan_score"] == pytest.approx(plan_score(plan))
    worker = role_view(stored, WORKER)
    assert len({t.segment for t in worker.turns}) == 1, "the worker's episode is one extending sequence"
    assert "Plan:" in json.dumps(worker.turns[0].messages[-1]) and plan.splitlines()[0] in json.dumps(
        worker.turns[0].messages[-1])
    assert role_view(stored, PLANNER).reward == pytest.approx(plan_score(plan))


def test_the_one_policy_agent_runs_with_a_list_of_policy_models(served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, _by_role(GOOD_PLAN, roles=False)),
                    MtrlConfig.from_dict({"advanced": {"policy_models": [PLANNER, WORKER]}}))
    row = load_instances("test")[1]
    task = Task(id=row["id"], prompt=row["prompt"], ground_truth=row["ground_truth"], split=row["split"],
                data=row["data"])
    created = handle.coordinator.create_rollout(task, max_turns=10)
    spec = RolloutSpec(rollout_id=created.rollout_id, group_id=created.group_id, task=task, token=created.token,
                       endpoint=handle.url, model_name="policy", sampling=SamplingParams(max_tokens=256),
                       max_turns=10, timeout_s=60, policy_models=(PLANNER, WORKER))

    async def one() -> None:
        with rollout_scope(spec):
            await run_one_policy(task)

    asyncio.run(asyncio.wait_for(one(), 120))
    stored = handle.store.get_rollout(created.rollout_id)
    assert stored.status is RolloutStatus.COMPLETED, stored.error
    assert [t.role for t in stored.turns] == [None] * 8  # one policy: no roles
    assert stored.role_rewards == {} and stored.metrics["plan_score"] == 1.0
