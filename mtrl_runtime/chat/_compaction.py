"""Compactions read from the wire: the agent summarised its own history.

Agents compact their context when it fills (Strands'
``SummarizingConversationManager``, LangChain's ``SummarizationMiddleware``):
one model call writes a summary of the older messages, and the next call
sends the summary in place of them, followed by the recent messages. Nothing
on the wire names this, but the shape is plain and framework-free:

- the summary call's request does not extend the conversation (it is a
  separate call: its own system prompt, or the history written out as text);
- the call after it does not extend the summary call either, and one of its
  user or system messages carries the summary call's reply text (whitespace
  aside: LangChain prefixes "Here is a summary...", Strands re-sends the text
  as a user message).

Then the summary call is the compaction's summary turn and the call after it
goes on with the episode (``BreakReason.COMPACTED``). A request shaped like a
compaction (a message the rollout never sent, then the rollout's most recent
messages, the oldest dropped) whose summary no call of the rollout wrote is
``unattributed``: the coordinator refuses it, naming the fix, rather than
train a summary nobody can find or split the episode without a word.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ._extension import ConversationState
from ._messages import message_key

_SUMMARY_ROLES = ("user", "system")


@dataclass(frozen=True)
class Compaction:
    """A compaction found in a request: where its summary sits and which call wrote it."""

    summary_at: int  # index of the request message that carries the summary
    attributed: bool  # True: the rollout's previous call wrote the summary (its summary turn)


def find_compaction(
    before: ConversationState | None, last: ConversationState | None, messages: Sequence[dict[str, Any]]
) -> Compaction | None:
    """The compaction ``messages`` (a request that did not extend ``last``) makes, or None when it makes none.

    ``last`` is the state after the rollout's previous call (the candidate
    summary call), ``before`` the state before it (the conversation it may
    have summarised).
    """
    if last is None:
        return None
    summary = _squash(last.reply.get("content") or "")
    separate = before is not None and last.segment != before.segment  # the summary call did not extend the history
    if separate and summary and not last.reply.get("tool_calls"):
        for at, message in enumerate(messages):
            if message["role"] in _SUMMARY_ROLES and summary in _squash(message.get("content") or ""):
                return Compaction(summary_at=at, attributed=True)
    for state in (last, before):
        at = _summary_then_tail(state, messages)
        if at is not None:
            return Compaction(summary_at=at, attributed=False)
    return None


def _summary_then_tail(state: ConversationState | None, messages: Sequence[dict[str, Any]]) -> int | None:
    """Where a message new to ``state``'s history sits, followed by that history's latest messages with its
    oldest (after the system prompt) dropped; None when ``messages`` is not shaped so."""
    if state is None:
        return None
    history = [message_key(m) for m in (*state.messages, state.reply) if m["role"] != "system"]
    keys = [message_key(m) for m in messages]
    at = next((i for i, m in enumerate(messages) if m["role"] != "system"), None)
    if at is None or at + 1 >= len(keys) or messages[at]["role"] not in _SUMMARY_ROLES or keys[at] in history:
        return None
    kept = keys[at + 1 :]
    for start in range(1, len(history)):  # the oldest message dropped: start > 0
        tail = history[start:]
        if kept[: len(tail)] == tail:
            return at
    return None


def _squash(text: Any) -> str:
    """``text`` with runs of whitespace as one space, trimmed: how a summary is compared where it is re-sent."""
    return " ".join(str(text).split())


__all__ = ["Compaction", "find_compaction"]
