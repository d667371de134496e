"""Whose model call is it: for a run-wide credential, the call's own messages decide between live rollouts.

A SageMaker SigV4 token stands for the whole run (``server._compat_routes``);
the rollout such a call names comes from the trajectory header, and
SageMaker's ``wrap_model`` writes that header into the model's shared
``client_args`` when a rollout calls ``stream()``, while the OpenAI client
reads it later, after an await: with one wrapped model shared by concurrent
rollouts (the SDK's docstring pattern), a call often carries another
rollout's header. So for such calls (and only those: a rollout's own token
binds its calls to it) the messages say whose call it is:

1. a call that continues the named rollout's conversation (its last request
   and the reply the endpoint sent) is that rollout's;
2. else one that continues exactly one other live rollout's conversation is
   that rollout's;
3. else it is a first turn (or a rewritten history). The named rollout
   keeps it when its task's prompt is the call's first user message and it
   has no turn yet, or the call carries a history (an assistant message:
   the rollout trimmed or edited its own). Otherwise it goes to a live
   rollout with no turn yet whose task's prompt is the call's first user
   message; with none, the named rollout keeps it.

Moved calls are counted (``compat_reattributed``). Rollouts of one group
share their first prompt, so a first call carrying a sibling's header is
indistinguishable from the sibling's own; those first turns may be swapped
between siblings (docs/reliability.md says so).
"""

from __future__ import annotations

import logging
from typing import Any

from ..chat import ConversationState, message_key
from ..types import Task, TrajectoryStore
from ._counters import CoordinatorCounters
from ._live import LiveRollouts

log = logging.getLogger("mtrl.coordinator")


def call_owner(
    live: LiveRollouts, store: TrajectoryStore, named: str, messages: list[dict[str, Any]],
    counters: CoordinatorCounters,
) -> str:
    """The live rollout ``messages`` belong to (see the module docstring); ``named`` when nothing says otherwise."""
    current = live.get(named)  # None: ended (a stale header may name a rollout that has ended since)
    if current is not None and _continues(current.conversation, messages):
        return named
    others = [r for r in _live_rollouts(live) if r.rollout_id != named and _continues(r.conversation, messages)]
    if len(others) == 1:
        return _moved(named, others[0].rollout_id, counters)
    if others:
        return named
    first = _first_user_text(messages)
    if first is None:
        return named
    tasks: dict[str, Task | None] = {}
    if current is not None and _task_text(store, current.task_id, tasks) == first and (
        current.turns == 0 or any(m.get("role") == "assistant" for m in messages)
    ):
        return named  # its own first turn, or its own history rewritten (trimmed, edited)
    fresh = [r for r in _live_rollouts(live) if r.turns == 0 and _task_text(store, r.task_id, tasks) == first]
    return _moved(named, fresh[0].rollout_id, counters) if fresh else named


def _moved(named: str, owner: str, counters: CoordinatorCounters) -> str:
    counters.compat_reattributed += 1
    if counters.compat_reattributed == 1:  # once per coordinator: the cause and its limit
        log.warning(
            "mtrl: a SageMaker call named rollout %s but its messages are rollout %s's; recorded there "
            "(counter compat_reattributed). A wrap_model-wrapped model shared by concurrent rollouts sends "
            "stale trajectory headers; rollouts of one group share a first prompt and cannot be told apart "
            "that way: build one wrapped model per rollout (inside the entrypoint) to be exact",
            named, owner,
        )
    return owner


def _live_rollouts(live: LiveRollouts) -> list[Any]:
    return [r for r in (live.get(rollout_id) for rollout_id in live.ids()) if r is not None]


def _continues(state: ConversationState | None, messages: list[dict[str, Any]]) -> bool:
    """True when ``messages`` start with ``state``'s request and the reply sent for it."""
    if state is None or len(messages) <= len(state.messages):
        return False
    expected = [message_key(m) for m in state.messages] + [message_key(state.reply)]
    return [message_key(m) for m in messages[: len(expected)]] == expected


def _first_user_text(messages: list[dict[str, Any]]) -> str | None:
    return next((m.get("content") for m in messages if m.get("role") == "user"), None)


def _task_text(store: TrajectoryStore, task_id: str, cache: dict[str, Task | None]) -> str | None:
    if task_id not in cache:
        cache[task_id] = store.get_task(task_id)
    task = cache[task_id]
    if task is None:
        return None
    if task.prompt is not None:
        return task.prompt
    return next((str(m.get("content")) for m in task.messages or () if m.get("role") == "user"), None)


__all__ = ["call_owner"]
