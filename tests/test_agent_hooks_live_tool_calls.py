"""Strands, the OpenAI Agents SDK and ``record_tool_call`` send each tool call as it ends, as LangGraph does.

Three agents written as their docs teach, each against the served scripted
policy (``lookup``, then ``add``, then ``wait``, a tool that blocks until the
test lets it go, then an answer): a Strands ``Agent`` built in the rollout
(its hooks arrive by themselves), an OpenAI Agents SDK ``Agent`` run with
``Runner.run(..., hooks=MtrlRunHooks())``, and a plain ``openai`` tool loop
that calls ``record_tool_call``. While the agent is blocked in ``wait`` its
first two calls are in the store and counted by the coordinator (the run's
progress line); a rollout that then completes stores each call once, in
order, on its turn; one cancelled there (a run's stop or deadline) keeps the
two, and nothing is flagged unrecorded.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import pytest

from _adapter_support import TOOLS, add, aopenai_tool_loop, key_of, lookup
from _live_tool_calls import (
    Gate,
    check_completed_two,
    in_its_third_tool,
    poll,
    stop_in_the_third_tool,
    stored_calls,
    three_tools_policy,
)
from mtrl_adapters import rollout
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.types import RolloutStatus

_WAIT_TOOL = {
    "type": "function",
    "function": {
        "name": "wait",
        "description": "Wait for the key's turn.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
    },
}


def _strands(gate: Gate) -> Callable[[Any], Any]:
    """A Strands Agent built inside the rollout, as Strands' docs build one (``OpenAIModel``, ``@tool``s)."""
    pytest.importorskip("strands")
    from strands import Agent, tool
    from strands.models.openai import OpenAIModel

    model = OpenAIModel(client_args={"api_key": "sk-user-real-key", "base_url": "https://api.openai.com/v1"},
                        model_id="gpt-4o-mini")

    @rollout
    async def run(task):
        agent = Agent(model=model, tools=[tool(lookup), tool(add), tool(gate.wait)], callback_handler=None)
        await agent.invoke_async(task.prompt)

    return run


def _openai_agents(gate: Gate) -> Callable[[Any], Any]:
    """An OpenAI Agents SDK Agent with function tools over the user's own ``AsyncOpenAI``, run with mtrl's hooks."""
    pytest.importorskip("agents")
    import openai
    from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, function_tool

    from mtrl_adapters.openai_agents import MtrlRunHooks

    client = openai.AsyncOpenAI(api_key="sk-user-real-key", base_url="https://api.openai.com/v1", max_retries=0)
    agent = Agent(
        name="lookup-agent",
        instructions="Look the key up, add five, then wait for the key's turn.",
        tools=[function_tool(lookup), function_tool(add), function_tool(gate.wait)],
        model=OpenAIResponsesModel(model="gpt-4o-mini", openai_client=client),
    )

    @rollout
    async def run(task):
        await Runner.run(agent, task.prompt, hooks=MtrlRunHooks(), run_config=RunConfig(tracing_disabled=True))

    return run


def _record_tool_call(gate: Gate) -> Callable[[Any], Any]:
    """The agent's own tool loop over an ``openai.AsyncOpenAI`` client, each call reported by ``record_tool_call``."""
    import openai

    @rollout
    async def run(task):
        client = openai.AsyncOpenAI(api_key="sk-user-real-key", base_url="https://api.openai.com/v1", max_retries=0)
        await aopenai_tool_loop(client, task, [*TOOLS, _WAIT_TOOL], {"lookup": lookup, "add": add, "wait": gate.wait})

    return run


_AGENTS = {"strands": _strands, "openai_agents": _openai_agents, "record_tool_call": _record_tool_call}


@pytest.mark.parametrize("kind", sorted(_AGENTS))
async def test_the_first_two_calls_are_stored_while_the_agent_is_in_its_third(served, tiny_tok, kind):
    """Both completed calls are stored and counted while the agent is blocked in ``wait``; once it returns, the
    rollout completes with the three calls, each stored once, in order, on the turn that asked for it."""
    handle = served(ScriptedEngine(tiny_tok, three_tools_policy))
    gate = Gate()
    counted_before = handle.coordinator.counters["tool_calls"]
    spec, running = await in_its_third_tool(handle, gate, _AGENTS[kind](gate))
    try:
        names = await asyncio.to_thread(poll, lambda: [c.name for c in stored_calls(handle, spec.rollout_id)],
                                        ["lookup", "add"])
        assert names == ["lookup", "add"]  # stored while the agent is still inside `wait`
        assert handle.coordinator.counters["tool_calls"] - counted_before == 2  # what the progress line shows
        assert handle.store.get_rollout(spec.rollout_id, with_turns=False).status is RolloutStatus.RUNNING
    finally:
        gate.release()
    await running
    stored = handle.store.get_rollout(spec.rollout_id)
    key = key_of(spec.task.prompt)
    assert stored.status is RolloutStatus.COMPLETED, (stored.status, stored.error)
    check_completed_two(stored, key)
    [third] = stored.tool_calls[2:]
    assert (third.name, third.turn_index, third.status, str(third.result)) == ("wait", 2, "success", f"{key} waited")
    assert third.call_id == stored.turns[2].tool_calls[0]["id"]
    assert handle.coordinator.counters["tool_calls"] - counted_before == 3  # none sent twice


@pytest.mark.parametrize("kind", sorted(_AGENTS))
async def test_a_rollout_cancelled_in_its_third_tool_keeps_the_two_before(served, tiny_tok, caplog, kind):
    """The run stops (its dispatcher cancels the agent's task, then ends the rollout ``interrupted``) while the
    agent is inside its third tool: the two calls it completed are kept, and nothing is called unrecorded."""
    handle = served(ScriptedEngine(tiny_tok, three_tools_policy))
    gate = Gate()
    spec, running = await in_its_third_tool(handle, gate, _AGENTS[kind](gate))
    await stop_in_the_third_tool(handle, gate, spec, running, caplog)
