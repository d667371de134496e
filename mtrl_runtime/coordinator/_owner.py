"""Whose model call is it, under a run-wide credential: the prompt when it names one rollout, else the header.

A SageMaker SigV4 token stands for the whole run (``server._compat_routes``),
so a call made with one names its rollout by its trajectory header alone.
SageMaker's ``wrap_model`` writes that header into the model's shared
``client_args`` when a rollout calls ``stream()``, and the OpenAI client reads
it later, after an await: with one wrapped model shared by concurrent
rollouts, a call may carry another live rollout's header. mtrl decides by
what proves the sender, and refuses (409, nothing recorded) what nothing
does; it never picks one of several rollouts a call could belong to.

The owner (:func:`call_owner`): when the call's first user message is the
task prompt of exactly one live rollout, that rollout (only its agent was
given that prompt; a call moved this way is counted ``compat_reattributed``);
otherwise the rollout the header names. Then the owner is checked
(:func:`check_owner`, under its lock) and the call refused when:

1. it echoes a tool-call id the endpoint minted for another live rollout's
   reply (a 96-bit random id: holding it proves holding that reply). That
   rollout's reply reached an agent whose call names another rollout, so
   its turns cannot be vouched for: it ends failed, flagged
   ``STALE_HEADER_FLAG`` (when the sender was its own agent, that agent
   fails on the refusal anyway);
2. it neither carries an id of the owner's replies nor continues the owner's
   conversation, and continues another live rollout's;
3. its first user message is the task prompt of several live rollouts (a
   group's siblings share it) and the header names none of them (a call
   that neither carries the header rollout's ids nor continues its
   conversation);
4. it starts a conversation with the owner's prompt after the owner was
   answered, while a sibling with that prompt has not been: either may be
   the sender.

Refusals are counted (``compat_stale_header_refused``) and the first one
logs the cause and the fix. What no check can catch: a stale header naming a
sibling in exactly the sender's state (both unanswered, same prompt) is
taken as the header says. The next call of either agent that carries a
minted id then ends both (rule 1, or rule 4 for the sibling's own first
call), so a multi-turn episode ends failed rather than trained on another
agent's turns; a one-call episode cannot be checked. One wrapped model per
rollout (built inside the entrypoint) sends its own header on every call and
meets none of these refusals.
"""

from __future__ import annotations

import logging
from typing import Any

from ..chat import ConversationState, message_key
from ..errors import Conflict
from ._counters import CoordinatorCounters
from ._live import LiveRollout, LiveRollouts

log = logging.getLogger("mtrl.coordinator")

STALE_HEADER_FLAG = "trajectory_header_stale"
"""The metric flag of a rollout ended because its reply reached an agent that named another rollout."""

FIX = ("SageMaker's wrap_model writes the trajectory header into the model's shared client_args, so a model shared "
       "by concurrent rollouts sends other rollouts' headers: build one wrapped model per rollout, inside the "
       "entrypoint (wrap_model(OpenAIModel(...)) per call), or send the rollout's own token instead of a SigV4 token")


class StaleTrajectoryHeader(Conflict):
    """A call under a run-wide credential whose messages prove its trajectory header names another rollout.

    ``implicated``: live rollouts whose replies reached the sender; the coordinator ends them failed.
    """

    def __init__(self, message: str, implicated: tuple[str, ...] = ()) -> None:
        super().__init__(message, param="X-Amzn-SageMaker-Trajectory-Id")
        self.implicated = implicated


def call_owner(live: LiveRollouts, named: str, messages: list[dict[str, Any]], counters: CoordinatorCounters) -> str:
    """The rollout a call belongs to (see the module docstring): the one live rollout whose prompt it starts with,
    else ``named``."""
    first = _first_user_text(messages)
    holders = [r.rollout_id for r in _live(live) if first is not None and r.prompt == first]
    if len(holders) != 1 or holders[0] == named:
        return named
    counters.compat_reattributed += 1
    if counters.compat_reattributed == 1:  # once per coordinator: the cause and its fix
        log.warning("mtrl: a SageMaker call named rollout %s but starts with rollout %s's task prompt, which no other "
                    "live rollout has; recorded there (counter compat_reattributed). %s", named, holders[0], FIX)
    return holders[0]


def check_owner(live: LiveRollouts, owner: str, messages: list[dict[str, Any]], counters: CoordinatorCounters) -> None:
    """Raise :class:`StaleTrajectoryHeader` when ``messages`` prove the call is not ``owner``'s (module docstring)."""
    current = live.get(owner)
    if current is None:  # ended: ``LiveRollouts.running`` answers that
        return
    problem, implicated = _problem(live, current, messages)
    if problem is None:
        return
    counters.compat_stale_header_refused += 1
    message = (f"a call under a run-wide SigV4 token was taken for rollout {owner!r} (by its trajectory header, or as "
               f"the one live rollout whose task prompt it starts with), but {problem}; refused, nothing recorded. {FIX}")
    if counters.compat_stale_header_refused == 1:  # once per coordinator; every refusal is counted
        log.warning("mtrl: %s (counter compat_stale_header_refused)", message)
    raise StaleTrajectoryHeader(message, implicated)


def _problem(live: LiveRollouts, owner: LiveRollout, messages: list[dict[str, Any]]) -> tuple[str | None, tuple[str, ...]]:
    """Why the call is not ``owner``'s and the rollouts it implicates; (None, ()) when nothing says so."""
    others = [r for r in _live(live) if r.rollout_id != owner.rollout_id]
    echoed = _echoed_ids(messages)
    minted_elsewhere = sorted({r.rollout_id for r in others if echoed & r.call_turns.keys()})
    if minted_elsewhere:  # rule 1
        return f"it carries tool-call ids the endpoint minted for rollout(s) {minted_elsewhere}'s replies", tuple(
            minted_elsewhere)
    if echoed & owner.call_turns.keys() or _continues(owner.conversation, messages):
        return None, ()  # its own conversation, continued or rewritten
    first = _first_user_text(messages)
    siblings = [r for r in others if first is not None and r.prompt == first]
    if first != owner.prompt and siblings:  # rule 3 (one holder would have owned the call: ``call_owner``)
        return f"it starts with the task prompt of rollouts {sorted(r.rollout_id for r in siblings)}, not this one's", ()
    if any(m.get("role") == "assistant" for m in messages):
        continued = sorted(r.rollout_id for r in others if _continues(r.conversation, messages))
        if continued:  # rule 2
            return f"it continues rollout(s) {continued}'s conversation, not this one's", ()
        return None, ()  # the owner's own history, rewritten
    if first != owner.prompt:
        return None, ()  # the agent words its first message itself: the header decides
    unanswered = sorted(r.rollout_id for r in siblings if r.turns == 0)
    if owner.turns > 0 and unanswered:  # rule 4
        return (f"it starts this rollout's conversation again after it was answered, while rollout(s) {unanswered} "
                "with the same prompt have not been: the call may be theirs"), ()
    return None, ()


def _live(live: LiveRollouts) -> list[LiveRollout]:
    return [r for r in (live.get(rollout_id) for rollout_id in live.ids()) if r is not None]


def _first_user_text(messages: list[dict[str, Any]]) -> str | None:
    return next((m.get("content") for m in messages if m.get("role") == "user"), None)


def _echoed_ids(messages: list[dict[str, Any]]) -> set[str]:
    """The tool-call ids a request carries: on its assistant messages' calls and its tool results."""
    ids = set()
    for message in messages:
        for call in message.get("tool_calls") or ():
            if call.get("id"):
                ids.add(str(call["id"]))
        if message.get("role") == "tool" and message.get("tool_call_id"):
            ids.add(str(message["tool_call_id"]))
    return ids


def _continues(state: ConversationState | None, messages: list[dict[str, Any]]) -> bool:
    """True when ``messages`` start with ``state``'s request and the reply sent for it."""
    if state is None or len(messages) <= len(state.messages):
        return False
    expected = [message_key(m) for m in state.messages] + [message_key(state.reply)]
    return [message_key(m) for m in messages[: len(expected)]] == expected


__all__ = ["FIX", "STALE_HEADER_FLAG", "StaleTrajectoryHeader", "call_owner", "check_owner"]
