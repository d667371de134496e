"""A rollout's end, once decided, always reaches the store.

The end is decided by the first decisive event (``coordinator/_lifecycle``)
and then written (``coordinator/_ends``): it waits for a model call in flight
to record its turn, writes the flags and the default reward, then the final
status. Three ways that write used to be lost, leaving the row ``running``
for good (found under load: a run stopped with rollouts still ``running`` and
"0 rollouts marked interrupted", a step counting a rollout failed with the
error ``'running'``): the caller cancelled while it waited for the call in
flight; a second event (the executor's answer) returning while the first
end was still being written, its caller then reading the row; a store error
while the flags were written. Real coordinator, real SQLite store, the
scripted engine with a delay standing for a slow model call.
"""

from __future__ import annotations

import asyncio

import pytest

from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.coordinator import Coordinator
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.store import SQLiteStore
from mtrl_runtime.testing import tiny_tokenizer
from mtrl_runtime.types import DeadlinePassed, ExecutorEnded, RolloutStatus, SamplingParams, Task

MESSAGES = [{"role": "user", "content": "What is 6 x 7?"}]
CALL_S = 1.0  # how long the model call in flight takes


@pytest.fixture
def coordinator(tmp_path):
    store = SQLiteStore(tmp_path / "trajectories.db")
    engine = ScriptedEngine(tiny_tokenizer(), ["ANSWER 42"] * 8, delay_s=CALL_S)
    yield Coordinator(engine, store, MtrlConfig())
    store.close()


async def call_in_flight(coordinator: Coordinator) -> tuple[str, asyncio.Task]:
    """A new rollout and a model call of it that is being answered (it holds the rollout's turn lock)."""
    handle = coordinator.create_rollout(Task(id="t0", prompt="What is 6 x 7?"), "g0", step=0)
    call = asyncio.create_task(coordinator.chat(handle.rollout_id, handle.token, MESSAGES, None,
                                                SamplingParams(max_tokens=8)))
    await asyncio.sleep(0.2)
    assert not call.done()
    return handle.rollout_id, call


def status(coordinator: Coordinator, rollout_id: str) -> tuple[RolloutStatus, str | None]:
    row = coordinator.recorded(rollout_id, with_turns=False)
    return row.status, row.error


def test_an_end_whose_caller_is_cancelled_while_a_call_is_in_flight_still_reaches_the_store(coordinator):
    async def scenario() -> None:
        rollout_id, call = await call_in_flight(coordinator)
        ending = asyncio.create_task(coordinator.end(rollout_id, DeadlinePassed(5.0)))
        await asyncio.sleep(0.1)  # decided; waiting for the call's turn to be recorded
        ending.cancel()  # the run stopping, a step's collection torn down
        with pytest.raises(asyncio.CancelledError):
            await ending
        assert await coordinator.settle_ends(0.05) == [rollout_id]  # still writing: named, not waited for long
        assert status(coordinator, rollout_id)[0] is RolloutStatus.RUNNING
        await call  # the call in flight finishes and records its turn
        assert await coordinator.settle_ends() == []
        assert status(coordinator, rollout_id) == (
            RolloutStatus.TIMED_OUT, "the rollout ran longer than advanced.rollout_timeout_s=5 s and was stopped")
        row = coordinator.recorded(rollout_id)
        assert len(row.turns) == 1 and row.metrics.get("reward_defaulted") == 1.0
        assert coordinator.live_rollout_ids() == []

    asyncio.run(scenario())


def test_a_later_event_returns_only_once_the_earlier_end_is_in_the_store(coordinator):
    async def scenario() -> None:
        rollout_id, call = await call_in_flight(coordinator)
        first = asyncio.create_task(coordinator.end(rollout_id, DeadlinePassed(5.0)))
        await asyncio.sleep(0.1)
        started = asyncio.get_running_loop().time()
        # the executor answers: this event ends nothing, and its caller (the dispatcher) reads the row next
        assert await coordinator.end(rollout_id, ExecutorEnded(RolloutStatus.FAILED, "agent error")) is False
        waited = asyncio.get_running_loop().time() - started
        assert status(coordinator, rollout_id)[0] is RolloutStatus.TIMED_OUT, "read the row before its end landed"
        assert waited > 0.3  # it waited for the call in flight, then the write
        assert await first is True
        await call

    asyncio.run(scenario())


def test_a_store_error_while_the_end_is_written_ends_the_rollout_failed_and_is_raised(coordinator, monkeypatch):
    async def broken(*args, **kwargs):
        raise OSError("disk full")

    async def scenario() -> None:
        handle = coordinator.create_rollout(Task(id="t1", prompt="What is 6 x 7?"), "g1", step=0)
        monkeypatch.setattr(coordinator.store, "aset_reward", broken)  # the default reward cannot be written
        with pytest.raises(OSError, match="disk full"):
            await coordinator.end(handle.rollout_id, ExecutorEnded(RolloutStatus.COMPLETED, None))
        got, error = status(coordinator, handle.rollout_id)
        assert got is RolloutStatus.FAILED
        assert error == "recording the rollout's end (completed) failed: OSError: disk full"
        assert coordinator.counters["rollouts_failed"] == 1

    asyncio.run(scenario())
