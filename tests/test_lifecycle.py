"""A rollout's end: the state machine's rules alone, then the coordinator feeding it events on loopback."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.coordinator import RolloutLife
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.types import (
    AgentEnded,
    DeadlinePassed,
    ExecutorEnded,
    RewardReported,
    RolloutCoordinator,
    RolloutStatus,
    RunStopped,
    Task,
    TurnLimitHit,
)

COMPLETED, FAILED, TIMED_OUT = RolloutStatus.COMPLETED, RolloutStatus.FAILED, RolloutStatus.TIMED_OUT


def test_the_first_decisive_event_wins_and_later_ones_change_nothing():
    life = RolloutLife()
    ending = life.decide(AgentEnded(COMPLETED))
    assert (ending.status, ending.error, ending.default_reward) == (COMPLETED, None, True)
    assert life.decide(ExecutorEnded(FAILED, "boom")) is None
    assert life.decide(DeadlinePassed(5.0)) is None
    assert life.ended is ending


def test_a_reported_reward_means_no_default_and_the_turn_limit_is_flagged():
    life = RolloutLife()
    assert life.decide(RewardReported()) is None
    assert life.decide(TurnLimitHit()) is None
    ending = life.decide(ExecutorEnded(COMPLETED))
    assert not ending.default_reward and ending.flags == {"hit_turn_limit": 1.0}


@pytest.mark.parametrize(
    ("event", "status", "error_part"),
    [
        (DeadlinePassed(0.5), TIMED_OUT, "rollout_timeout_s=0.5"),
        (RunStopped(), RolloutStatus.INTERRUPTED, "cancelled"),  # a stopped run is not the agent's failure
        (ExecutorEnded(RolloutStatus.RUNNING, None), FAILED, None),  # an executor cannot leave it running
        (AgentEnded(TIMED_OUT, "the agent did not finish within timeout_s=2"), TIMED_OUT, "timeout_s=2"),
    ],
)
def test_each_end_event_maps_to_one_status(event, status, error_part):
    ending = RolloutLife().decide(event)
    assert ending.status is status
    assert (error_part is None and ending.error is None) or error_part in ending.error


def test_an_end_that_awaits_the_reward_waits_for_it_or_for_the_executor():
    waiting = RolloutLife()
    assert waiting.decide(AgentEnded(COMPLETED, awaits_reward=True)) is None
    assert waiting.awaiting_reward is COMPLETED
    ending = waiting.decide(RewardReported())
    assert (ending.status, ending.default_reward) == (COMPLETED, False) and waiting.awaiting_reward is None

    never_rewarded = RolloutLife()
    never_rewarded.decide(AgentEnded(COMPLETED, awaits_reward=True))
    ending = never_rewarded.decide(ExecutorEnded(COMPLETED))
    assert (ending.status, ending.default_reward) == (COMPLETED, True)

    asked_then_server_failed = RolloutLife()
    asked_then_server_failed.decide(AgentEnded(COMPLETED, awaits_reward=True))
    ending = asked_then_server_failed.decide(ExecutorEnded(FAILED, "the agent server answered 500"))
    assert (ending.status, ending.error) == (COMPLETED, None)  # the agent's own word on its end stands

    asked_to_fail = RolloutLife()
    asked_to_fail.decide(AgentEnded(FAILED, awaits_reward=True))
    assert asked_to_fail.decide(ExecutorEnded(FAILED, "boom")).error == "boom"

    rewarded_first = RolloutLife()
    rewarded_first.decide(RewardReported())
    assert rewarded_first.decide(AgentEnded(COMPLETED, awaits_reward=True)).status is COMPLETED


def test_an_ending_says_whether_the_agents_side_reported_it():
    """Only an ``AgentEnded`` (at once, or waiting for its reward or its executor) is the agent's own end, which
    its adapter's buffered reports came with; the other ends came without the agent's word."""
    assert RolloutLife().decide(AgentEnded(COMPLETED)).by_agent
    for second in (RewardReported(), ExecutorEnded(FAILED, "boom")):
        waiting = RolloutLife()
        waiting.decide(AgentEnded(COMPLETED, awaits_reward=True))
        assert waiting.decide(second).by_agent
    for event in (ExecutorEnded(FAILED, "boom"), DeadlinePassed(1.0), RunStopped()):
        assert not RolloutLife().decide(event).by_agent


def test_an_unknown_event_is_refused():
    with pytest.raises(TypeError, match="expected a rollout event"):
        RolloutLife().decide("done")  # type: ignore[arg-type]


def test_the_coordinator_ends_a_rollout_once_from_events_and_refuses_what_comes_after(served, tiny_tok):
    config = MtrlConfig.from_dict({"advanced": {"default_reward": -0.5}})
    handle = served(ScriptedEngine(tiny_tok, lambda req, text: "DONE"), config)
    coordinator = handle.coordinator
    assert isinstance(coordinator, RolloutCoordinator)
    made = coordinator.create_rollout(Task(id="t", prompt="q"))
    auth = {"authorization": f"Bearer {made.token}"}
    base = f"{handle.url}/rollouts/{made.rollout_id}"

    async def deadline() -> tuple[bool, bool]:
        first = await coordinator.end(made.rollout_id, DeadlinePassed(0.25))
        second = await coordinator.end(made.rollout_id, ExecutorEnded(COMPLETED))
        return first, second

    assert asyncio.run_coroutine_threadsafe(deadline(), handle.loop).result(10) == (True, False)
    stored = handle.store.get_rollout(made.rollout_id)
    assert stored.status is TIMED_OUT and "rollout_timeout_s=0.25" in stored.error
    assert stored.reward == -0.5 and stored.reward_defaulted
    late = httpx.post(f"{base}/complete", json={"status": "completed"}, headers=auth)
    assert late.status_code == 409 and "already ended as timed_out" in late.json()["error"]["message"]
    assert httpx.post(f"{base}/reward", json={"reward": 1.0}, headers=auth).status_code == 409
    assert coordinator.live_rollout_ids() == []
    assert coordinator.counters["rollouts_timed_out"] == 1
