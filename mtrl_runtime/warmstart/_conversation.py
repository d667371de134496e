"""``Conversation``: one demonstrated agent conversation, whatever source it was imported from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ..types import JSON


@dataclass(frozen=True)
class Conversation:
    """OpenAI chat-format ``messages`` (assistant ``tool_calls``, ``tool`` results) and the ``tools`` offered.

    ``source`` says where it came from (``file.jsonl:12``, an MLflow trace id,
    an OpenTelemetry trace id) so a bad one can be named. ``cut`` holds the
    indices of assistant messages the model's token limit cut (the trace
    recorded ``finish_reason: length``): they are rendered as the rollout
    recorded them, without an end token, so fine-tuning does not teach the
    model to stop mid-reply. ``reward`` is the reward the source recorded for
    the episode (an mtrl run's traces), None where it records none.
    """

    messages: tuple[Mapping[str, JSON], ...]
    tools: tuple[Mapping[str, JSON], ...] = ()
    source: str = ""
    cut: frozenset[int] = frozenset()
    reward: float | None = None


def select_by_reward(
    conversations: Sequence[Conversation], min_reward: float | None
) -> tuple[list[Conversation], int]:
    """(the conversations whose recorded reward is at least ``min_reward``, how many were left out).

    Rewarded conversations are an RL run's rollouts, failures included: without
    ``min_reward`` they are refused (fine-tuning on them all would imitate the
    failures). With ``min_reward``, a conversation that records no reward is
    refused by name: there is nothing to filter it by.
    """
    rewarded = [c.reward for c in conversations if c.reward is not None]
    if min_reward is None:
        if rewarded:
            raise ValueError(
                f"{len(rewarded)} of {len(conversations)} conversations are an mtrl run's rollouts with their rewards "
                f"({min(rewarded):g} to {max(rewarded):g}): give --min-reward to keep the successes; fine-tuning on "
                "every rollout would imitate the failures too")
        return list(conversations), 0
    unrewarded = next((c for c in conversations if c.reward is None), None)
    if unrewarded is not None:
        raise ValueError(f"--min-reward {min_reward:g}: {unrewarded.source or 'a conversation'} records no reward "
                         "(only an mtrl run's traces do); leave --min-reward out for these conversations")
    kept = [c for c in conversations if c.reward is not None and c.reward >= min_reward]
    return kept, len(conversations) - len(kept)
