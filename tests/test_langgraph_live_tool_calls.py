"""LangGraph tool calls reach the coordinator as each one ends, so a rollout stopped mid-way keeps them.

A real ReAct agent (``create_react_agent`` over a ``ToolNode``, as LangGraph's
docs build one) against the served scripted policy: the model calls
``lookup``, then ``add``, then ``wait``, a tool that blocks until the test
lets it go (then returns, raises, or raises ``KeyboardInterrupt``, what
Ctrl-C delivers). While the agent is blocked in ``wait`` the two calls it
completed are already in the store and in the coordinator's ``tool_calls``
counter (the run's progress line); however the rollout then ends (the agent
raises, its task is cancelled as a run's stop or deadline cancels it, Ctrl-C),
both stay, each on the turn that asked for it, and nothing is flagged
unrecorded. Calls nobody sent before an end its agent never reported (a
tool loop that records none, stopped mid-way) are flagged, and the warning
names that end rather than blaming the agent's callbacks or hooks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import warnings
from typing import Any

import pytest

from _adapter_support import TOOLS, add, key_of, lookup, policy, specs, tasks
from _live_tool_calls import (
    Gate,
    check_completed_two,
    end_on_server,
    in_its_third_tool,
    poll,
    stop_in_the_third_tool,
    stored_calls,
)
from _live_tool_calls import three_tools_policy as _policy
from mtrl_adapters import rollout, rollout_scope
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.rollouts import Heartbeat, RolloutTally
from mtrl_runtime.types import RolloutStatus, RunStopped

pytest.importorskip("langgraph")
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from langgraph.prebuilt import ToolNode  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # create_react_agent moved to langchain.agents in LangGraph 1.0
    from langgraph.prebuilt import create_react_agent  # noqa: E402


def _graph(gate: Gate) -> Any:
    llm = ChatOpenAI(model="gpt-4o-mini", api_key="sk-user-real-key", base_url="https://api.openai.com/v1",
                     max_retries=0)
    tools = ToolNode([tool(lookup), tool(add), tool(gate.wait)], handle_tool_errors=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return create_react_agent(llm, tools)


async def _agent_in_its_third_tool(handle: Any, gate: Gate) -> tuple[Any, asyncio.Task]:
    """One rollout of an async agent (``ainvoke``), started on this loop and now blocked inside ``wait``: its spec
    and its task."""
    graph = _graph(gate)

    @rollout
    async def run(task):
        await graph.ainvoke({"messages": [("user", task.prompt)]})

    return await in_its_third_tool(handle, gate, run)


async def test_tool_calls_are_stored_as_they_end_and_kept_when_the_agent_raises(served, tiny_tok):
    """(b) both completed calls are counted and stored while the agent is blocked in its third tool; (a) the
    third tool's exception fails the rollout, and both are kept, with the third recorded failed."""
    handle = served(ScriptedEngine(tiny_tok, _policy))
    gate = Gate()
    counted_before = handle.coordinator.counters["tool_calls"]
    beat = Heartbeat(RolloutTally(), handle.coordinator.counters, print)
    beat.mark("step 1/1")
    spec, running = await _agent_in_its_third_tool(handle, gate)
    key = key_of(spec.task.prompt)
    try:
        names = await asyncio.to_thread(poll, lambda: [c.name for c in stored_calls(handle, spec.rollout_id)],
                                        ["lookup", "add"])
        assert names == ["lookup", "add"]  # stored while the agent is still inside `wait`
        assert handle.coordinator.counters["tool_calls"] - counted_before == 2
        assert "turns 3, tool calls 2, errors 0" in beat.line()  # the run's progress line, mid-rollout
        assert handle.store.get_rollout(spec.rollout_id, with_turns=False).status is RolloutStatus.RUNNING
    finally:
        gate.release(RuntimeError("the wait tool broke"))
    with pytest.raises(RuntimeError, match="the wait tool broke"):
        await running
    stored = handle.store.get_rollout(spec.rollout_id)
    assert stored.status is RolloutStatus.FAILED and "the wait tool broke" in stored.error
    check_completed_two(stored, key)
    [third] = stored.tool_calls[2:]
    assert (third.name, third.turn_index, third.status) == ("wait", 2, "error")
    assert "RuntimeError: the wait tool broke" in third.error
    assert handle.coordinator.counters["tool_calls"] - counted_before == 3


async def test_a_rollout_cancelled_in_its_third_tool_keeps_the_two_before(served, tiny_tok, caplog):
    """The run stops (its dispatcher cancels the agent's task, then ends the rollout ``interrupted``) while the
    agent is inside its third tool: the two calls it completed are kept, and nothing is called unrecorded."""
    handle = served(ScriptedEngine(tiny_tok, _policy))
    gate = Gate()
    spec, running = await _agent_in_its_third_tool(handle, gate)
    await stop_in_the_third_tool(handle, gate, spec, running, caplog)


def test_ctrl_c_in_a_sync_agents_third_tool_keeps_the_two_before(served, tiny_tok):
    """Ctrl-C (``KeyboardInterrupt``) inside the third tool of a sync ``invoke``: the decorator reports no end
    (a ``KeyboardInterrupt`` is not the agent's failure); the run ends the rollout ``interrupted`` and the two
    calls the agent completed are in the store."""
    handle = served(ScriptedEngine(tiny_tok, _policy))
    gate = Gate()
    gate.release(KeyboardInterrupt())  # the tool is interrupted as soon as it is entered
    graph = _graph(gate)
    [spec] = specs(handle, tasks(1))

    @rollout
    def run(task):
        graph.invoke({"messages": [("user", task.prompt)]})

    with rollout_scope(spec), pytest.raises(KeyboardInterrupt):
        run(spec.task)
    assert gate.entered.is_set()
    assert end_on_server(handle, spec.rollout_id, RunStopped("cancelled: Ctrl-C"))
    stored = handle.store.get_rollout(spec.rollout_id)
    assert stored.status is RolloutStatus.INTERRUPTED
    assert [c.name for c in stored.tool_calls] == ["lookup", "add"]
    check_completed_two(stored, key_of(spec.task.prompt))


def test_calls_lost_with_an_end_the_agent_never_reported_are_flagged_with_that_cause(served, tiny_tok, caplog):
    """Calls nobody sent when the run stops a rollout (here a plain OpenAI tool loop that ran ``lookup`` and never
    recorded it; every adapter and ``record_tool_call`` send theirs as each ends) are flagged
    ``tool_calls_unrecorded`` as before, and the warning names the stop, not missing hooks or callbacks."""
    import openai

    handle = served(ScriptedEngine(tiny_tok, policy))
    [spec] = specs(handle, tasks(1))

    @rollout
    def run(task):
        client = openai.OpenAI(api_key="sk-user-real-key", base_url="https://api.openai.com/v1", max_retries=0)
        messages = [{"role": "user", "content": task.prompt}]
        first = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS).choices[0].message
        [call] = first.tool_calls
        args = json.loads(call.function.arguments)
        messages += [first.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": str(lookup(**args))}]
        client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)  # the model read the result
        raise KeyboardInterrupt  # Ctrl-C before the agent runs `add`

    with rollout_scope(spec), pytest.raises(KeyboardInterrupt):
        run(spec.task)
    with caplog.at_level(logging.WARNING, logger="mtrl.coordinator"):
        assert end_on_server(handle, spec.rollout_id, RunStopped("cancelled: Ctrl-C"))
    stored = handle.store.get_rollout(spec.rollout_id)
    assert stored.tool_calls == () and stored.metrics["tool_calls_unrecorded"] == 1.0
    [warning] = [r.getMessage() for r in caplog.records if "tool call(s) unrecorded" in r.getMessage()]
    assert "ended before its agent reported its end" in warning, warning
    assert "agent_factory" not in warning and "pass mtrl_adapters.langgraph's callbacks" not in warning


def test_a_failed_call_waiting_for_its_text_holds_the_calls_after_it_in_order(served, tiny_tok):
    """``send_tool_calls`` sends the calls up to a failed one still waiting for the text the model read; once it
    has it, that call and the ones after go, in the order they ended; ``waiting_too`` sends one that never got it."""
    from mtrl_adapters import RolloutContext

    handle = served(ScriptedEngine(tiny_tok, _policy))
    [spec] = specs(handle, tasks(1))
    ctx = RolloutContext.from_spec(spec)

    def stored() -> list[tuple[str, Any, str]]:
        return [(c.name, c.result, c.status) for c in stored_calls(handle, spec.rollout_id)]

    def run(name: str, error: str | None = None, call_id: str | None = None) -> None:
        ctx.tool_started(("test", name), name, {}, call_id)
        ctx.tool_finished(("test", name), result=None if error else f"{name} ok", error=error)
        ctx.send_tool_calls()

    run("first")
    run("broken", error="KeyError: 'x'", call_id="c-broken")
    run("after")
    assert stored() == [("first", "first ok", "success")]
    assert ctx.fill_tool_result("c-broken", "Error: KeyError('x')")
    ctx.send_tool_calls()
    assert stored() == [("first", "first ok", "success"), ("broken", "Error: KeyError('x')", "error"),
                        ("after", "after ok", "success")]
    run("unanswered", error="ValueError: y", call_id="c-unanswered")
    run("last")
    assert len(stored()) == 3
    ctx.send_tool_calls(waiting_too=True)  # a model call started: no text will come for it
    assert stored()[3:] == [("unanswered", None, "error"), ("last", "last ok", "success")]
    assert ctx.take_tool_calls() == [] and not ctx.fill_tool_result("c-unanswered", "late")
