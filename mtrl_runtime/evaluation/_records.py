"""What evaluation reads off a recorded rollout: its EvalRecord, its final answer, its conversation.

The store records every turn the endpoint served; these functions turn a
``Rollout`` (with its turns) into the plain values the metrics, the strict
scorer and the environment checks compare.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..rewards import last_conversation
from ..tripwires import TRIP_METRIC_PREFIX, TRIPWIRE_ZEROED
from ..types import ROLLOUT_FLAGS, Rollout, Turn
from ._metrics import EvalRecord

# Metrics the coordinator adds to a rollout itself (its flags, and a zeroed reward's mark; each tripwire's
# ``tripwire/<wire>`` count too); the rest came from the reward function. Training and evaluation read them alike.
COORDINATOR_METRICS = frozenset({*ROLLOUT_FLAGS, TRIPWIRE_ZEROED})


def record_of(rollout: Rollout, success_threshold: float) -> EvalRecord:
    """The EvalRecord of one finished rollout; success is ``total_reward >= success_threshold``."""
    turns = _ordered(rollout.turns)
    reward = rollout.total_reward
    return EvalRecord(
        task_id=rollout.task_id,
        reward=reward,
        success=reward >= success_threshold,
        status=rollout.status.value,
        turns=len(turns),
        hit_turn_limit=bool(rollout.metrics.get("hit_turn_limit")),
        hit_token_cap_count=sum(t.finish_reason == "length" for t in turns),
        responses=len(turns),
        tool_calls=requested_tools(turns),
        metrics=reward_function_metrics(rollout),
        reasoning_tokens=sum(t.reasoning_tokens for t in turns),
        completion_tokens=sum(len(t.completion_ids) for t in turns),
        tripwires=tripped_wires(rollout),
    )


def tripped_wires(rollout: Rollout) -> tuple[str, ...]:
    """The names of the tripwires the rollout tripped (its ``tripwire/<wire>`` metrics), sorted."""
    return tuple(sorted(k[len(TRIP_METRIC_PREFIX):] for k in rollout.metrics if k.startswith(TRIP_METRIC_PREFIX)))


def reward_function_metrics(rollout: Rollout) -> dict[str, float]:
    """The metrics the agent reported with ``update_reward`` (none for a defaulted reward): every metric but the
    coordinator's (``COORDINATOR_METRICS``, ``tripwire/<wire>``)."""
    if rollout.reward_defaulted:
        return {}
    return {k: float(v) for k, v in rollout.metrics.items()
            if k not in COORDINATOR_METRICS and not k.startswith(TRIP_METRIC_PREFIX)}


def requested_tools(turns: Sequence[Turn]) -> tuple[str, ...]:
    """The name of every tool call the model asked for, in order (what the endpoint parsed)."""
    names = []
    for turn in _ordered(turns):
        for call in turn.tool_calls:
            function = call.get("function") if isinstance(call, Mapping) else None
            names.append(str(function.get("name")) if isinstance(function, Mapping) else "(unnamed)")
    return tuple(names)


def final_text(rollout: Rollout) -> str:
    """The text of the model's last reply: the agent's final answer ("" when the model never answered)."""
    turns = _ordered(rollout.turns)
    return turns[-1].completion_text if turns else ""


def conversation(rollout: Rollout) -> list[dict[str, Any]]:
    """The rollout's messages as the model last saw them, plus its final reply and outcome.

    The last entry (role ``mtrl:outcome``) holds status, reward and error,
    so two runs that differ only in how they ended still differ.
    """
    messages = last_conversation(rollout)
    messages.append({
        "role": "mtrl:outcome",
        "status": rollout.status.value,
        "reward": rollout.total_reward,
        "error": rollout.error,
    })
    return messages


def _ordered(turns: Sequence[Turn]) -> list[Turn]:
    return sorted(turns, key=lambda t: t.index)


__all__ = [
    "COORDINATOR_METRICS",
    "conversation",
    "final_text",
    "record_of",
    "requested_tools",
    "reward_function_metrics",
    "tripped_wires",
]
