"""``Demonstration``: one trajectory to imitate, as training samples, from any source."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..types import Sample
from ._conversation import Conversation
from ._render import ConversationRenderer


@dataclass(frozen=True)
class Demonstration:
    """One trajectory to imitate: its training samples, and the group the held-out split keeps together.

    Samples carry advantage 1 and loss mask 1 on the model's own tokens (its
    turns and their end tokens), 0 elsewhere.
    """

    name: str  # a rollout id, or a conversation's source (file:line)
    group: str  # its task id (rollouts), or its source (conversations)
    samples: tuple[Sample, ...]

    @property
    def tokens(self) -> int:
        return sum(sum(s.loss_mask_T) for s in self.samples)


def conversation_demonstrations(
    renderer: ConversationRenderer, conversations: Sequence[Conversation]
) -> list[Demonstration]:
    """Each conversation rendered for the policy (``ConversationRenderer.samples``) as a demonstration."""
    demos = []
    for n, conversation in enumerate(conversations):
        name = conversation.source or f"conversation {n}"
        samples = renderer.samples(conversation, rollout_id=name)
        demos.append(Demonstration(name=name, group=name, samples=tuple(samples)))
    return demos


__all__ = ["Demonstration", "conversation_demonstrations"]
