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
unrecorded. Calls an adapter still holds until the rollout's end (the
last test) are lost with an end its agent never reported, and the warning
says so rather than blaming the agent's callbacks or hooks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import warnings
from typing import Any

import pytest

from _adapter_support import OFFSET, TOOLS, add, key_of, lookup, policy, specs, tasks, value_of
from mtrl_adapters import record_tool_call, rollout, rollout_scope
from mtrl_runtime.engines import ScriptedEngine, ScriptedReply
from mtrl_runtime.rollouts import Heartbeat, RolloutTally
from mtrl_runtime.types import RolloutStatus, RunStopped

pytest.importorskip("langgraph")
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from langgraph.prebuilt import ToolNode  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # create_react_agent moved to langchain.agents in LangGraph 1.0
    from langgraph.prebuilt import create_react_agent  # noqa: E402

_WAIT_S = 20.0  # the longest the test waits for a state it expects


def _policy(request: Any, prompt: str) -> ScriptedReply | str:
    """lookup(key), then add(value, OFFSET), then wait(key), then an answer: four turns."""
    key = key_of(prompt)
    if request.turn_index == 0:
        return ScriptedReply.tool_call("lookup", {"key": key})
    if request.turn_index == 1:
        return ScriptedReply.tool_call("add", {"a": value_of(key), "b": OFFSET})
    if request.turn_index == 2:
        return ScriptedReply.tool_call("wait", {"key": key})
    return f"Done with {key}."


class _Gate:
    """The ``wait`` tool: says it was entered, blocks until released, then ends as the test said."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self._released = threading.Event()
        self._ending: BaseException | None = None

    def release(self, ending: BaseException | None = None) -> None:
        self._ending = ending
        self._released.set()

    def wait(self, key: str) -> str:
        """Wait for the key's turn."""
        self.entered.set()
        if not self._released.wait(_WAIT_S):
            raise TimeoutError("the test never released the wait tool")
        if self._ending is not None:
            raise self._ending
        return f"{key} waited"


def _graph(gate: _Gate) -> Any:
    llm = ChatOpenAI(model="gpt-4o-mini", api_key="sk-user-real-key", base_url="https://api.openai.com/v1",
                     max_retries=0)
    tools = ToolNode([tool(lookup), tool(add), tool(gate.wait)], handle_tool_errors=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return create_react_agent(llm, tools)


def _stored_calls(handle: Any, rollout_id: str) -> list[Any]:
    return list(handle.store.get_rollout(rollout_id).tool_calls)


def _poll(read: Any, want: Any) -> Any:
    """``read()`` once it equals ``want``, or its last value after ``_WAIT_S`` seconds."""
    deadline = time.monotonic() + _WAIT_S
    value = read()
    while value != want and time.monotonic() < deadline:
        time.sleep(0.02)
        value = read()
    return value


def _check_completed_two(rollout: Any, key: str) -> None:
    """lookup on turn 0 and add on turn 1, in that order, their results and the turns' call ids kept."""
    lookup_call, add_call = rollout.tool_calls[:2]
    assert (lookup_call.name, lookup_call.arguments, str(lookup_call.result)) == ("lookup", {"key": key},
                                                                                   str(value_of(key)))
    assert (add_call.name, add_call.arguments, str(add_call.result)) == (
        "add", {"a": value_of(key), "b": OFFSET}, str(value_of(key) + OFFSET))
    assert [c.turn_index for c in rollout.tool_calls[:2]] == [0, 1]
    assert [c.call_id for c in rollout.tool_calls[:2]] == [rollout.turns[i].tool_calls[0]["id"] for i in (0, 1)]
    assert all(c.status == "success" for c in rollout.tool_calls[:2])
    assert "tool_calls_unrecorded" not in rollout.metrics, rollout.metrics


def _end_on_server(handle: Any, rollout_id: str, event: Any) -> bool:
    """Feed an end event to the served coordinator, on its own loop (what a stopping run's dispatcher does)."""
    return asyncio.run_coroutine_threadsafe(handle.coordinator.end(rollout_id, event), handle.loop).result(_WAIT_S)


async def _agent_in_its_third_tool(handle: Any, gate: _Gate) -> tuple[Any, asyncio.Task]:
    """One rollout of an async agent (``ainvoke``), started on this loop and now blocked inside ``wait``: its spec
    and its task."""
    graph = _graph(gate)
    [spec] = specs(handle, tasks(1))

    @rollout
    async def run(task):
        await graph.ainvoke({"messages": [("user", task.prompt)]})

    async def one() -> None:
        with rollout_scope(spec):
            await run(spec.task)

    running = asyncio.create_task(one())
    if not await asyncio.to_thread(gate.entered.wait, _WAIT_S):
        gate.release()
        raise AssertionError("the agent never reached its third tool")
    return spec, running


async def test_tool_calls_are_stored_as_they_end_and_kept_when_the_agent_raises(served, tiny_tok):
    """(b) both completed calls are counted and stored while the agent is blocked in its third tool; (a) the
    third tool's exception fails the rollout, and both are kept, with the third recorded failed."""
    handle = served(ScriptedEngine(tiny_tok, _policy))
    gate = _Gate()
    counted_before = handle.coordinator.counters["tool_calls"]
    beat = Heartbeat(RolloutTally(), handle.coordinator.counters, print)
    beat.mark("step 1/1")
    spec, running = await _agent_in_its_third_tool(handle, gate)
    key = key_of(spec.task.prompt)
    try:
        names = await asyncio.to_thread(_poll, lambda: [c.name for c in _stored_calls(handle, spec.rollout_id)],
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
    _check_completed_two(stored, key)
    [third] = stored.tool_calls[2:]
    assert (third.name, third.turn_index, third.status) == ("wait", 2, "error")
    assert "RuntimeError: the wait tool broke" in third.error
    assert handle.coordinator.counters["tool_calls"] - counted_before == 3


async def test_a_rollout_cancelled_in_its_third_tool_keeps_the_two_before(served, tiny_tok, caplog):
    """The run stops (its dispatcher cancels the agent's task, then ends the rollout ``interrupted``) while the
    agent is inside its third tool: the two calls it completed are kept, and nothing is called unrecorded."""
    handle = served(ScriptedEngine(tiny_tok, _policy))
    gate = _Gate()
    spec, running = await _agent_in_its_third_tool(handle, gate)
    try:
        # sent as they ended (a send still in flight at the stop's instant is refused once the rollout has ended)
        await asyncio.to_thread(_poll, lambda: len(_stored_calls(handle, spec.rollout_id)), 2)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
    finally:
        gate.release()  # the tool's thread ends on its own; its result goes nowhere
    with caplog.at_level(logging.WARNING, logger="mtrl.coordinator"):
        assert _end_on_server(handle, spec.rollout_id, RunStopped())
    stored = handle.store.get_rollout(spec.rollout_id)
    assert stored.status is RolloutStatus.INTERRUPTED
    assert [c.name for c in stored.tool_calls] == ["lookup", "add"]
    _check_completed_two(stored, key_of(spec.task.prompt))
    assert "unrecorded" not in caplog.text


def test_ctrl_c_in_a_sync_agents_third_tool_keeps_the_two_before(served, tiny_tok):
    """Ctrl-C (``KeyboardInterrupt``) inside the third tool of a sync ``invoke``: the decorator reports no end
    (a ``KeyboardInterrupt`` is not the agent's failure); the run ends the rollout ``interrupted`` and the two
    calls the agent completed are in the store."""
    handle = served(ScriptedEngine(tiny_tok, _policy))
    gate = _Gate()
    gate.release(KeyboardInterrupt())  # the tool is interrupted as soon as it is entered
    graph = _graph(gate)
    [spec] = specs(handle, tasks(1))

    @rollout
    def run(task):
        graph.invoke({"messages": [("user", task.prompt)]})

    with rollout_scope(spec), pytest.raises(KeyboardInterrupt):
        run(spec.task)
    assert gate.entered.is_set()
    assert _end_on_server(handle, spec.rollout_id, RunStopped("cancelled: Ctrl-C"))
    stored = handle.store.get_rollout(spec.rollout_id)
    assert stored.status is RolloutStatus.INTERRUPTED
    assert [c.name for c in stored.tool_calls] == ["lookup", "add"]
    _check_completed_two(stored, key_of(spec.task.prompt))


def test_calls_lost_with_an_end_the_agent_never_reported_are_flagged_with_that_cause(served, tiny_tok, caplog):
    """Adapters that still send a rollout's calls with its end (here ``record_tool_call`` in a plain OpenAI tool
    loop) lose them when the run stops the rollout first: flagged ``tool_calls_unrecorded`` as before, and the
    warning names that cause, not missing hooks or callbacks."""
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
        record_tool_call("lookup", args, result=lookup(**args), call_id=call.id)  # held until the rollout's end
        messages += [first.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": str(lookup(**args))}]
        client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)  # the model read the result
        raise KeyboardInterrupt  # Ctrl-C before the agent runs `add`

    with rollout_scope(spec), pytest.raises(KeyboardInterrupt):
        run(spec.task)
    with caplog.at_level(logging.WARNING, logger="mtrl.coordinator"):
        assert _end_on_server(handle, spec.rollout_id, RunStopped("cancelled: Ctrl-C"))
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
        return [(c.name, c.result, c.status) for c in _stored_calls(handle, spec.rollout_id)]

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
