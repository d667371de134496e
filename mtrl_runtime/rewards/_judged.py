"""Training on a group judge: its scores become a finished group's stored rewards, before advantages.

``JudgedRewards.rescore(task, rollouts)`` (the dispatcher calls it when a
training step's group is complete, ``types.GroupRescorer``) judges the
group in one request and, for each rollout, in the store:

- the reward becomes the judge's score (a scalar; per-turn rewards are replaced);
- the metrics keep the agent's own reward as ``agent_reward`` (its total; the
  first judged value is kept when a resumed run judges a rollout again),
  ``agent_reward_defaulted`` (1 when the agent never reported one) and ``judged`` 1;
- the judge's request is added as a non-policy ``ModelCall`` (latency, tokens):
  it shows in the rollout's trace and is never trained on. The one request
  judged the whole group, so each rollout of the group lists the same call.

A judge that fails stops the step with its error: no rollout trains on a
reward the judge did not give. A rollout a tripwire zeroed
(``tripwire_zeroed``, ``advanced.tripwires.on_trip: zero``) keeps reward 0
whatever the judge says: the judge sees it, its score is not given.

``TurnJudgedRewards`` does the same with a per-turn judge (``per_turn:
true``, for ``group_based_per_turn``): each rollout's assistant turns are
judged in one request, and the scores become its per-turn rewards.
"""

from __future__ import annotations

import asyncio
import ipaddress
from typing import Sequence
from urllib.parse import urlsplit

from ..types import ModelCall, Rollout, Task, TrajectoryStore
from ._judge import GroupJudge, JudgeVerdict
from ._judge_spec import JudgeSpec
from ._trajectory import trajectory_of
from ._turn_judge import TurnJudge, turns_of

TRIPWIRE_ZEROED = "tripwire_zeroed"  # tripwires.TRIPWIRE_ZEROED: the coordinator zeroed it; the zero stands
AGENT_REWARD = "agent_reward"
AGENT_REWARD_DEFAULTED = "agent_reward_defaulted"
JUDGED = "judged"


class JudgedRewards:
    """Rewrites a finished group's rewards with a ``GroupJudge``'s scores (see the module docstring)."""

    def __init__(self, judge: GroupJudge, store: TrajectoryStore) -> None:
        self.judge = judge
        self.store = store

    async def rescore(self, task: Task, rollouts: Sequence[Rollout]) -> tuple[Rollout, ...]:
        """Judge ``rollouts`` (one group of ``task``), store the scores and the call; the rollouts as stored now."""
        if not rollouts:
            return ()
        verdict = await self.judge.ajudge([trajectory_of(r, task) for r in rollouts])
        await asyncio.gather(*(self._store(r, score, verdict) for r, score in zip(rollouts, verdict.scores)))
        stored = await asyncio.gather(*(asyncio.to_thread(self.store.get_rollout, r.id) for r in rollouts))
        missing = [r.id for r, s in zip(rollouts, stored) if s is None]
        if missing:  # pragma: no cover - the store lost a rollout it committed
            raise RuntimeError(f"judged rollouts {missing!r} are missing from the store")
        return tuple(s for s in stored if s is not None)

    async def _store(self, rollout: Rollout, score: float | Sequence[float], verdict: JudgeVerdict) -> None:
        metrics = dict(rollout.metrics)
        if not metrics.get(JUDGED) and not metrics.get(TRIPWIRE_ZEROED):  # judged before (a resumed run's reused
            metrics[AGENT_REWARD] = rollout.total_reward  # rollout), or zeroed by a tripwire: the agent reward stands
            metrics[AGENT_REWARD_DEFAULTED] = float(rollout.reward_defaulted)
        metrics[JUDGED] = 1.0
        call = verdict.call
        if isinstance(score, (int, float)):
            await self.store.aset_reward(rollout.id, 0.0 if metrics.get(TRIPWIRE_ZEROED) else score, None, metrics)
        else:
            turns = tuple(0.0 if metrics.get(TRIPWIRE_ZEROED) else s for s in score)
            await self.store.aset_reward(rollout.id, None, turns, metrics)
        await self.store.aadd_model_call(ModelCall(
            rollout_id=rollout.id, protocol="openai", model=call.model, latency_s=call.latency_s,
            started_at=call.started_at, input_tokens=call.input_tokens, output_tokens=call.output_tokens,
        ))


class TurnJudgedRewards(JudgedRewards):
    """Rewrites each rollout's per-turn rewards with a ``TurnJudge``'s scores of its turns (recorded order)."""

    judge: TurnJudge

    async def rescore(self, task: Task, rollouts: Sequence[Rollout]) -> tuple[Rollout, ...]:
        if not rollouts:
            return ()
        judged = [r for r in rollouts if r.turns]  # a rollout without a model turn has nothing to score per turn
        verdicts = await asyncio.gather(*(self.judge.aturns(r, task, turns_of(r, self.judge.spec.max_chars_per_message))
                                          for r in judged))
        await asyncio.gather(*(self._store(r, v.scores, v) for r, v in zip(judged, verdicts)))
        stored = await asyncio.gather(*(asyncio.to_thread(self.store.get_rollout, r.id) for r in rollouts))
        return tuple(s for s in stored if s is not None)


_KINDS = {False: (GroupJudge, JudgedRewards), True: (TurnJudge, TurnJudgedRewards)}  # by JudgeSpec.per_turn


def judged_rewards(
    spec: JudgeSpec | None, store: TrajectoryStore, policy_endpoint: str, field: str = "advanced.group_judge"
) -> JudgedRewards | None:
    """The ``JudgedRewards`` of a configured judge (None: no judge), refused if it points at ``policy_endpoint``."""
    if spec is None:
        return None
    judge_type, rewards_type = _KINDS[spec.per_turn]
    judge = judge_type.from_spec(spec)
    refuse_policy_endpoint(judge.base_url, policy_endpoint, f"{field}.base_url")
    return rewards_type(judge, store)


def refuse_policy_endpoint(judge_url: str, policy_endpoint: str, field: str = "base_url") -> None:
    """A ValueError when ``judge_url`` reaches the coordinator at ``policy_endpoint`` (the policy judging itself)."""
    judge, policy = _address(judge_url), _address(policy_endpoint)
    if judge is not None and judge == policy:
        raise ValueError(
            f"{field}: {judge_url!r} is the coordinator's own endpoint ({policy_endpoint}): the policy would judge "
            "its own rollouts through the capture path. Serve the judge model elsewhere (another `mtrl serve "
            "--inference` or any OpenAI-compatible server) and point base_url there")


def _address(url: str) -> tuple[str, int] | None:
    """``(host, port)`` with every loopback or wildcard address as one host (they reach the same server here)."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.hostname is None:
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname.lower()
    if host == "localhost":
        return ("local", port)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return (host, port)
    return ("local", port) if address.is_loopback or address.is_unspecified else (str(address), port)


__all__ = ["AGENT_REWARD", "AGENT_REWARD_DEFAULTED", "JUDGED", "TRIPWIRE_ZEROED", "JudgedRewards",
           "TurnJudgedRewards", "judged_rewards", "refuse_policy_endpoint"]
