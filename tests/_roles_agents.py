"""The two-role agent the roles training tests run (named on ``mtrl train`` / ``mtrl eval`` as file:function).

A plain OpenAI-SDK agent: the planner's call names ``planner-model``, the worker's ``worker-model``; the worker is
rewarded by what it wrote, the planner apart (``role_rewards``). The tiny model samples at random, so rewards vary
within each group: ``planner_and_worker`` by a parity of each text, ``spread_planner_and_worker`` by one of seven
levels (a group of four ties for a role with probability 1/343: every step trains every role).
"""

from __future__ import annotations

import zlib
from typing import Any, Callable

from mtrl_adapters import rollout, update_reward

ROLES = {"planner": "planner-model", "worker": "worker-model"}


def parity(text: str) -> float:
    return float(zlib.crc32(text.encode()) % 2)


def seven_levels(text: str) -> float:
    return (zlib.crc32(text.encode()) % 7) / 6


def make_agent(score: Callable[[str], float]) -> Any:
    """The planner's plan, then the worker's reply; each rewarded by ``score`` of what it wrote."""

    @rollout
    async def planner_and_worker(task: Any) -> str:
        import openai

        client = openai.AsyncOpenAI(api_key="sk-user", base_url="https://api.openai.com/v1")
        plan = await client.chat.completions.create(model=ROLES["planner"], messages=[
            {"role": "user", "content": f"Plan: {task.prompt}"}])
        plan_text = plan.choices[0].message.content or ""
        reply = await client.chat.completions.create(model=ROLES["worker"], messages=[
            {"role": "system", "content": plan_text}, {"role": "user", "content": task.prompt}])
        answer = reply.choices[0].message.content or ""
        update_reward(score(answer), role_rewards={"planner": score(plan_text)})
        await client.close()
        return answer

    return planner_and_worker


planner_and_worker = make_agent(parity)
spread_planner_and_worker = make_agent(seven_levels)


def episode_reward(trajectory: Any) -> float:
    """``spread_planner_and_worker``'s episode reward, read off a stored trajectory (``mtrl rescore``)."""
    return seven_levels(trajectory.final_answer)


def flat_reward(trajectory: Any) -> float:
    """One reward for every episode: no signal left for the roles the episode's reward trains."""
    return 0.5
