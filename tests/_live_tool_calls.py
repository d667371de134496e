"""What the live tool-call tests share: a policy that calls three tools, a third tool that blocks until the test
lets it go, and the checks on the two calls completed before it.

The scripted policy calls ``lookup(key)``, then ``add(value, OFFSET)``, then
``wait(key)`` (a :class:`Gate`), then answers. While an agent is blocked in
``wait``, the calls its adapter sent as they ended are in the store.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

from _adapter_support import OFFSET, key_of, specs, tasks, value_of
from mtrl_adapters import rollout_scope
from mtrl_runtime.engines import ScriptedReply
from mtrl_runtime.types import RolloutStatus, RunStopped

WAIT_S = 20.0  # the longest a test waits for a state it expects


def three_tools_policy(request: Any, prompt: str) -> ScriptedReply | str:
    """lookup(key), then add(value, OFFSET), then wait(key), then an answer: four turns."""
    key = key_of(prompt)
    if request.turn_index == 0:
        return ScriptedReply.tool_call("lookup", {"key": key})
    if request.turn_index == 1:
        return ScriptedReply.tool_call("add", {"a": value_of(key), "b": OFFSET})
    if request.turn_index == 2:
        return ScriptedReply.tool_call("wait", {"key": key})
    return f"Done with {key}."


class Gate:
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
        if not self._released.wait(WAIT_S):
            raise TimeoutError("the test never released the wait tool")
        if self._ending is not None:
            raise self._ending
        return f"{key} waited"

    async def reached(self) -> None:
        """Return once the agent is inside ``wait`` (without blocking the loop); let it go and fail if it never
        gets there."""
        if not await asyncio.to_thread(self.entered.wait, WAIT_S):
            self.release()
            raise AssertionError("the agent never reached its third tool")


def stored_calls(handle: Any, rollout_id: str) -> list[Any]:
    return list(handle.store.get_rollout(rollout_id).tool_calls)


def poll(read: Any, want: Any) -> Any:
    """``read()`` once it equals ``want``, or its last value after ``WAIT_S`` seconds."""
    deadline = time.monotonic() + WAIT_S
    value = read()
    while value != want and time.monotonic() < deadline:
        time.sleep(0.02)
        value = read()
    return value


def check_completed_two(rollout: Any, key: str) -> None:
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


def end_on_server(handle: Any, rollout_id: str, event: Any) -> bool:
    """Feed an end event to the served coordinator, on its own loop (what a stopping run's dispatcher does)."""
    return asyncio.run_coroutine_threadsafe(handle.coordinator.end(rollout_id, event), handle.loop).result(WAIT_S)


async def stop_in_the_third_tool(handle: Any, gate: Gate, spec: Any, running: asyncio.Task, caplog: Any) -> None:
    """The run stops while the agent is inside ``wait``: its dispatcher cancels the agent's task, then ends the
    rollout ``interrupted``. Checks the two calls completed before are kept, and nothing is called unrecorded."""
    try:
        # sent as they ended (a send still in flight at the stop's instant is refused once the rollout has ended)
        await asyncio.to_thread(poll, lambda: len(stored_calls(handle, spec.rollout_id)), 2)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
    finally:
        gate.release()  # the tool's thread ends on its own; its result goes nowhere
    with caplog.at_level(logging.WARNING, logger="mtrl.coordinator"):
        assert end_on_server(handle, spec.rollout_id, RunStopped())
    stored = handle.store.get_rollout(spec.rollout_id)
    assert stored.status is RolloutStatus.INTERRUPTED
    assert [c.name for c in stored.tool_calls] == ["lookup", "add"]
    check_completed_two(stored, key_of(spec.task.prompt))
    assert "unrecorded" not in caplog.text


async def in_its_third_tool(handle: Any, gate: Gate, run: Any) -> tuple[Any, asyncio.Task]:
    """One rollout of the decorated async agent ``run``, started on this loop and now blocked inside ``wait``: its
    spec and its task."""
    [spec] = specs(handle, tasks(1))

    async def one() -> None:
        with rollout_scope(spec):
            await run(spec.task)

    running = asyncio.create_task(one())
    await gate.reached()
    return spec, running
