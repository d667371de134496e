"""A rollout's life as a small state machine: typed events in, one final status out.

Everyone who learns something about a rollout's end tells the coordinator
with an event (the event types are part of the contract, in ``types``);
only :class:`RolloutLife` turns events into the end:

- ``RewardReported``: the agent reported its reward (``update_reward``).
- ``TurnLimitHit``: the agent asked for a turn past ``max_turns``.
- ``AgentEnded``: the agent's side says how the agent ended (the ``rollout``
  decorator: returned, raised, or cancelled at its timeout). With
  ``awaits_reward`` (SageMaker's feedback client completes a trajectory and
  reports its reward after) the end waits for the reward, or for the executor.
  A failure asked for that way carries no error text (SageMaker's
  ``/complete-rollout`` has no field for it): it waits past its reward for
  the executor, whose answer holds the agent's error, or for a second
  ``AgentEnded`` (the compat route's grace end) with a text.
- ``ExecutorEnded``: the executor returned (its outcome, or its own failure);
  an end the agent asked for that still waits for its reward takes precedence.
- ``DeadlinePassed``: the rollout outlived its deadline (the dispatcher owns
  the one deadline, ``advanced.rollout_timeout_s``).
- ``RunStopped``: the run stopped with the rollout still running: it ends
  ``interrupted`` (neither the agent's failure nor a timeout).
- ``Abandoned``: in ``mtrl serve`` nothing came for the rollout within
  ``advanced.server.rollout_ttl_s``: it ends ``abandoned`` (kept in the store).
- ``AttributionBroken``: a model call proved that one of the rollout's
  replies reached an agent that names another rollout (``_owner``): it ends
  ``failed`` with the reason, flagged, whatever its agent reports later.

The first event that ends the rollout wins; later ones change nothing
(``decide`` returns None). The :class:`Ending` says the status, the error,
whether the configured default reward must be given (the agent never
reported one: flagged ``reward_defaulted``), the flags to add to the
rollout's metrics, and whether the agent's side reported the end (an
``AgentEnded`` decided it: what its adapter held was sent with it). Pure: no I/O, no clock, so every rule is tested alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..types import (
    Abandoned,
    AgentEnded,
    AttributionBroken,
    DeadlinePassed,
    ExecutorEnded,
    RewardReported,
    RolloutEvent,
    RolloutStatus,
    RunStopped,
    TurnLimitHit,
)


@dataclass(frozen=True)
class Ending:
    """How a rollout ends: its final status and error, whether it gets the default reward, metric flags."""

    status: RolloutStatus
    error: str | None
    default_reward: bool
    flags: Mapping[str, float] = field(default_factory=dict)
    by_agent: bool = False  # the agent's side reported this end (AgentEnded), so its adapter's reports came first


def abandoned_error(ttl_s: float) -> str:
    return f"abandoned: no call or report came for advanced.server.rollout_ttl_s={ttl_s:g} s"


def deadline_error(limit_s: float) -> str:
    return f"the rollout ran longer than advanced.rollout_timeout_s={limit_s:g} s and was stopped"


@dataclass
class RolloutLife:
    """One live rollout's state machine (see the module docstring)."""

    rewarded: bool = False
    hit_turn_limit: bool = False
    pending: AgentEnded | None = None  # an end the agent asked for before its reward came
    ended: Ending | None = None

    def decide(self, event: RolloutEvent) -> Ending | None:
        """Take one event; return the Ending when this event ends the rollout, else None."""
        if self.ended is not None:
            return None
        if isinstance(event, RewardReported):
            self.rewarded = True
            if self.pending is None or self._awaits_failure_text:
                return None
            return self._end(self.pending.status, self.pending.error, by_agent=True)
        if isinstance(event, TurnLimitHit):
            self.hit_turn_limit = True
            return None
        if isinstance(event, AgentEnded):
            if event.awaits_reward and not self.rewarded:
                self.pending = event
                return None
            return self._end(event.status, event.error, by_agent=True)
        if isinstance(event, ExecutorEnded):
            if self.pending is not None:  # the agent's own word on its end stands; the executor's error explains a failure
                status = self.pending.status
                error = self.pending.error or (event.error if status is not RolloutStatus.COMPLETED else None)
                if status is RolloutStatus.FAILED and not error:
                    error = "the agent reported a failure without an error text, and its executor's answer held none"
                return self._end(status, error, by_agent=True)
            status = event.status if event.status.is_final else RolloutStatus.FAILED
            return self._end(status, event.error)
        if isinstance(event, DeadlinePassed):
            return self._end(RolloutStatus.TIMED_OUT, deadline_error(event.limit_s))
        if isinstance(event, RunStopped):
            return self._end(RolloutStatus.INTERRUPTED, event.reason)
        if isinstance(event, Abandoned):
            return self._end(RolloutStatus.ABANDONED, abandoned_error(event.ttl_s))
        if isinstance(event, AttributionBroken):
            return self._end(RolloutStatus.FAILED, event.reason, {event.flag: 1.0})
        raise TypeError(f"event: expected a rollout event, got {event!r}")

    @property
    def _awaits_failure_text(self) -> bool:
        """A failure the agent asked for without a text (SageMaker's ``/complete-rollout``): its reward alone
        does not end it; the executor's answer, which carries the agent's error, or a later ``AgentEnded`` does."""
        pending = self.pending
        return pending is not None and pending.status is RolloutStatus.FAILED and not pending.error

    @property
    def awaiting_reward(self) -> RolloutStatus | None:
        """The status an agent asked to end with while its reward is still to come (SageMaker compat)."""
        return self.pending.status if self.pending is not None and self.ended is None else None

    def _end(self, status: RolloutStatus, error: str | None, flags: Mapping[str, float] | None = None, *,
             by_agent: bool = False) -> Ending:
        if not status.is_final:
            raise ValueError(f"status: a rollout cannot end as {status.value!r}")
        flags = {**(flags or {}), **({"hit_turn_limit": 1.0} if self.hit_turn_limit else {})}
        self.ended = Ending(status, error, default_reward=not self.rewarded, flags=flags, by_agent=by_agent)
        return self.ended


__all__ = ["Ending", "RolloutLife", "abandoned_error", "deadline_error"]
