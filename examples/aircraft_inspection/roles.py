"""Two roles on the aircraft inspection task: a planner writes the inspection plan, a worker calls the tools.

The planner is one plain OpenAI chat call (model id ``planner``): given the
SOP and the request, it writes the plan, one ``Step N: <tool>`` line per SOP
step. The worker is the example's Strands agent (model id ``worker``) with
the plan added to its request. With ``advanced.policy_models: {planner:
planner, worker: worker}`` (``roles.yaml``) each role trains its own LoRA
adapter on its own calls: the worker on the episode's reward, the planner
on its own (``role_rewards``): the share of the SOP's six tool steps its plan
names in order (``plan_score``).

``run_one_policy`` is the same agent for a run whose ``policy_models`` is a
list (one adapter serves and learns both calls, ``roles_shared.yaml``): it
reports the plan's score as a metric only, since such a run has no roles to
reward apart.

    mtrl train examples/aircraft_inspection/roles.yaml --agent examples.aircraft_inspection.roles:run
"""

from __future__ import annotations

import re
from typing import Any

from strands.types.exceptions import MaxTokensReachedException

from mtrl_adapters import rollout, update_reward

from .agent import fields_for, make_client, new_agent, turn_budget_spent
from .prompts import sop_text
from .reward import reward

PLANNER, WORKER = "planner", "worker"  # the model ids each role's calls name
STEPS = ("validate_aircraft", "get_maintenance_record", "inspect_mechanical", "inspect_electrical",
         "check_incidents", "file_report")
PLANNER_PROMPT = ("You plan aircraft inspections. Read the SOP and the request, then write the plan: one line per "
                  "tool step, in order, as 'Step N: <tool>'. Write only the plan.")


def plan_score(plan: str) -> float:
    """The share of the SOP's tool steps the plan names in order (a step named out of order does not count)."""
    named = [m.group(1) for m in re.finditer(r"\b(" + "|".join(STEPS) + r")\b", plan)]
    matched, position = 0, 0
    for step in STEPS:
        if step in named[position:]:
            position = named.index(step, position) + 1
            matched += 1
    return matched / len(STEPS)


async def _episode(task: Any) -> tuple[str, str]:
    """The planner's plan, then the worker's answer (empty where it produced none)."""
    async with make_client() as client:  # one client for the episode's calls, closed with it
        planned = await client.chat.completions.create(model=PLANNER, max_tokens=96, messages=[
            {"role": "system", "content": f"{PLANNER_PROMPT}\n{sop_text()}"},
            {"role": "user", "content": task.prompt}])
        plan = planned.choices[0].message.content or ""
        agent = new_agent(task, client)
        agent.model.update_config(model_id=WORKER)  # the worker's calls name its role
        try:
            answer = str(await agent.invoke_async(f"{task.prompt}\nPlan:\n{plan}"))
        except MaxTokensReachedException:
            answer = ""
        except Exception as exc:
            if not turn_budget_spent(exc):
                raise
            answer = ""
    return plan, answer


@rollout
async def run(task: Any) -> str:
    """One episode with each role rewarded apart: the worker by the answer, the planner by its plan."""
    plan, answer = await _episode(task)
    score, metrics = reward(answer, task.ground_truth, fields_for(task))
    planned = plan_score(plan)
    update_reward(score, {**metrics, "plan_score": planned}, role_rewards={PLANNER: planned})
    return answer


@rollout
async def run_one_policy(task: Any) -> str:
    """The same episode for a run with one policy (``policy_models`` a list): the plan's score is a metric only."""
    plan, answer = await _episode(task)
    score, metrics = reward(answer, task.ground_truth, fields_for(task))
    update_reward(score, {**metrics, "plan_score": plan_score(plan)})
    return answer


__all__ = ["PLANNER", "PLANNER_PROMPT", "STEPS", "WORKER", "plan_score", "run", "run_one_policy"]
